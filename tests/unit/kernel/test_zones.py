"""Zones of a brain path (DESIGN 2.4): normalisation, escapes rejected, the most specific rule wins."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ambient.core.errors import UnsafePathError
from ambient.kernel.zones import (
    DEFAULT_RULES,
    KERNEL,
    PERSONAL,
    PROJECT,
    ZoneRule,
    merge_rules,
    normalize,
    zone_of,
    zones_below,
)


@pytest.mark.parametrize(
    ("path", "zone"),
    [
        ("agents/debug.md", KERNEL),
        ("profil/routing.yml", KERNEL),
        ("scripts/x.sh", KERNEL),
        ("KERNEL.md", KERNEL),
        ("brain-constitution.md", KERNEL),
        ("brain-compose.yml", KERNEL),
        ("CLAUDE.md", KERNEL),
        ("PATHS.md", KERNEL),
        ("BRAIN-INDEX.md", KERNEL),
        ("todo/today.md", PROJECT),
        ("projets/app/src/main.py", PROJECT),
        ("workspace/x", PROJECT),
        ("handoffs/h.md", PROJECT),
        ("infrastructure/vps/a.yml", PROJECT),
        ("anything/else.md", PROJECT),
        ("profil/capital.md", PERSONAL),
        ("profil/objectifs.md", PERSONAL),
        ("progression/2026.md", PERSONAL),
        ("MYSECRETS", PERSONAL),
        ("agents", KERNEL),
        ("KERNEL.md.bak", PROJECT),
        ("agentsX/file", PROJECT),
    ],
)
def test_default_zones(path: str, zone: str) -> None:
    """Each default rule of spec/002 (and the pre-flight extras) gives its zone; unknown paths are project."""
    assert zone_of(path) == zone


def test_most_specific_rule_wins() -> None:
    """profil/capital.md is personal although profil/ is kernel; an exact file beats a folder of equal length."""
    assert zone_of("profil/capital.md") == PERSONAL
    rules = (ZoneRule(prefix="a/", zone="kernel"), ZoneRule(prefix="a", zone="personal"))
    assert zone_of("a", rules) == "personal"
    assert zone_of("a/b", rules) == "kernel"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("./a//b/", "a/b/"), ("a/./b", "a/b"), ("a/b/", "a/b/"), ("", ""), ("%2e%2e/x", "%2e%2e/x"), ("a..b/c", "a..b/c")],
)
def test_normalize(raw: str, clean: str) -> None:
    """Normalisation drops '.' and empty parts, keeps a folder's trailing slash, and treats %2e%2e as a name."""
    assert normalize(raw) == clean


@pytest.mark.parametrize(
    "path", ["../x", "a/../../b", "a/..", "/etc/passwd", "..\\x", "x\x00y", "a/" + "n" * 256, "../../etc/passwd"]
)
def test_escapes_rejected(path: str) -> None:
    """A path that could leave the brain root is rejected, never given a zone (S-01)."""
    with pytest.raises(UnsafePathError):
        zone_of(path)


def test_zones_below_folder() -> None:
    """A folder scope touches its own zone and every more specific zone inside it."""
    assert zones_below("profil/") == {KERNEL, PERSONAL}
    assert zones_below("projets/") == {PROJECT}
    assert zones_below("profil/x.md") == {KERNEL}
    assert zones_below("") == {KERNEL, PROJECT, PERSONAL}


def test_merge_rules() -> None:
    """A brain's own rules add zones and override a default prefix."""
    rules = merge_rules([ZoneRule(prefix="reference/", zone="reference"), ZoneRule(prefix="scripts/", zone="project")])
    assert zone_of("reference/book.md", rules) == "reference"
    assert zone_of("scripts/x.sh", rules) == PROJECT
    assert len(rules) == len(DEFAULT_RULES) + 1


SAFE_PART = st.text(
    alphabet=st.characters(blacklist_characters="/\\\x00", blacklist_categories=("Cs",)), min_size=1, max_size=20
).filter(lambda p: p not in (".", ".."))


@pytest.mark.slow
@given(st.lists(SAFE_PART, min_size=1, max_size=6))
def test_safe_paths_always_get_a_kernel_zone(parts: list[str]) -> None:
    """Any path of ordinary components is normalised to itself and lands in one of the three zones."""
    path = "/".join(parts)
    if any(len(p.encode()) > 255 for p in parts):
        return
    assert normalize(path) == path
    assert zone_of(path) in (KERNEL, PROJECT, PERSONAL)


@pytest.mark.slow
@given(st.lists(SAFE_PART | st.just(".."), min_size=1, max_size=6).filter(lambda ps: ".." in ps))
def test_dotdot_anywhere_is_rejected(parts: list[str]) -> None:
    """A '..' component anywhere is rejected, even when it would stay inside (a/b/../c)."""
    with pytest.raises(UnsafePathError):
        normalize("/".join(parts))


_SEGMENTS = st.sampled_from(["a", "b", "ab", "profil", "capital.md", "x.md", ".hidden"])
_PATHS = st.builds(
    lambda parts, folder: "/".join(parts) + ("/" if folder else ""),
    st.lists(_SEGMENTS, min_size=1, max_size=4),
    st.booleans(),
)
# Few prefixes, so that duplicates (first one wins) and files beside folders of the same name are common.
_PREFIXES = st.one_of(
    st.sampled_from(["a", "a/", "a/b", "a/b/", "ab/", "profil/", "profil/capital.md", ".hidden/"]),
    st.sampled_from(["/", "a//", "./a", "a/./b/"]),
    _PATHS,
)
_ZONE_NAMES = st.sampled_from([KERNEL, PROJECT, PERSONAL, "custom"])


def _scan_every_rule(path: str, rules: tuple[ZoneRule, ...]) -> str:
    """The rule of the module docstring, written plainly: the most specific match, first among equals."""
    clean = normalize(path)
    best: ZoneRule | None = None
    for rule in rules:
        if rule.matches(clean) and (best is None or rule.specificity > best.specificity):
            best = rule
    return best.zone if best is not None else PROJECT


@pytest.mark.slow
@given(st.lists(st.builds(ZoneRule, prefix=_PREFIXES, zone=_ZONE_NAMES), max_size=8), _PATHS)
@example([ZoneRule(prefix="a/", zone=KERNEL), ZoneRule(prefix="a/", zone=PERSONAL)], "a/b")
@example([ZoneRule(prefix="a", zone=KERNEL), ZoneRule(prefix="a", zone=PERSONAL)], "a")
@example([ZoneRule(prefix="a/", zone=KERNEL), ZoneRule(prefix="a", zone=PERSONAL)], "a/")
def test_compiled_lookup_agrees_with_testing_every_rule(rules: list[ZoneRule], path: str) -> None:
    """zone_of answers from two lookups built once per rule tuple; it must agree with testing each rule,
    for duplicates, exact files beside folders of the same name, folder scopes and odd prefixes."""
    as_tuple = tuple(rules)
    assert zone_of(path, as_tuple) == _scan_every_rule(path, as_tuple)
    assert zone_of(path, iter(as_tuple)) == _scan_every_rule(path, as_tuple)  # not a tuple: no lookups
