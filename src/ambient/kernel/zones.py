"""Zones of a brain path (DESIGN 2.4, spec/002 "zone inferred from scope"): pure rules, no disk.

Paths are normalised first; one that leaves the brain root is rejected, never given a zone.
The most specific rule wins: ``profil/capital.md`` is personal although ``profil/`` is kernel.
A path no rule names is ``project`` ("any project folder", spec/002). Symlinks are the shell's
business: :func:`ambient.storage.fsutil.resolve_in_brain` resolves them before a path reaches here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict

from ambient.core.errors import UnsafePathError
from ambient.core.pathrules import normalize as normalize  # re-exported: zones owns the path rules

KERNEL: Final = "kernel"
PROJECT: Final = "project"
PERSONAL: Final = "personal"
KERNEL_ZONES: Final = frozenset({KERNEL, PROJECT, PERSONAL})


class ZoneRule(BaseModel):
    """``prefix`` ending in ``/`` names a folder and everything below; otherwise one exact file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str
    zone: str

    def matches(self, path: str) -> bool:
        if self.prefix.endswith("/"):
            folder = self.prefix[:-1]
            return path == folder or path.startswith(self.prefix)
        return path == self.prefix

    @property
    def specificity(self) -> tuple[int, int]:
        # Longer prefixes are more specific; an exact file beats a folder of the same length.
        return (len(self.prefix.rstrip("/")), 0 if self.prefix.endswith("/") else 1)


def _rules(spec: Mapping[str, Iterable[str]]) -> tuple[ZoneRule, ...]:
    return tuple(ZoneRule(prefix=p, zone=z) for z, prefixes in spec.items() for p in prefixes)


DEFAULT_RULES: Final[tuple[ZoneRule, ...]] = _rules(
    {
        KERNEL: [
            "agents/",
            "profil/",
            "scripts/",
            "KERNEL.md",
            "brain-constitution.md",
            "brain-compose.yml",
            # The original pre-flight tool also protects these (DESIGN 2.4).
            "CLAUDE.md",
            "PATHS.md",
            "BRAIN-INDEX.md",
        ],
        PROJECT: ["todo/", "projets/", "workspace/", "handoffs/", "infrastructure/"],
        PERSONAL: ["profil/capital.md", "profil/objectifs.md", "progression/", "MYSECRETS"],
    }
)


def zone_of(path: str, rules: Iterable[ZoneRule] = DEFAULT_RULES) -> str:
    """The zone of a brain-relative path: the most specific matching rule, else ``project``.

    A tuple of rules (a brain's rules are one tuple until the next reload) is compiled once into two lookups
    (:func:`_compiled`); other iterables are tested rule by rule.
    """
    clean = normalize(path)
    compiled = _compiled(rules) if isinstance(rules, tuple) else None
    return _lookup(clean, compiled) if compiled is not None else _scan_rules(clean, rules)


def _scan_rules(clean: str, rules: Iterable[ZoneRule]) -> str:
    best: ZoneRule | None = None
    for rule in rules:
        if rule.matches(clean) and (best is None or rule.specificity > best.specificity):
            best = rule
    return best.zone if best is not None else PROJECT


_Compiled = tuple[dict[str, str], dict[str, str]]  # exact file → zone, folder (no trailing '/') → zone
_COMPILED: dict[int, tuple[tuple[ZoneRule, ...], _Compiled | None]] = {}


def _plain_prefix(prefix: str) -> bool:
    try:
        return prefix not in ("", "/") and normalize(prefix) == prefix
    except UnsafePathError:
        return False


def _compiled(rules: tuple[ZoneRule, ...]) -> _Compiled | None:
    """The rules as two lookups: a path's zone is then a few dict probes, not a test of every rule.

    Performance (bench/fanout.py): every fan-out item has a new path, so answers remembered per path never
    helped, and testing each of the ~20 rules was ~10 µs per item. Kept by the tuple's identity (the tuple is
    kept alive with its lookups, so its id cannot be reused).
    """
    hit = _COMPILED.get(id(rules))
    if hit is not None and hit[0] is rules:
        return hit[1]
    files: dict[str, str] = {}
    folders: dict[str, str] = {}
    plain = all(_plain_prefix(rule.prefix) for rule in rules)  # else (``a//``, ``/``): test every rule
    for rule in rules if plain else ():  # the first of equally specific rules wins, as in _scan_rules
        if rule.prefix.endswith("/"):
            folders.setdefault(rule.prefix[:-1], rule.zone)
        else:
            files.setdefault(rule.prefix, rule.zone)
    if len(_COMPILED) >= 64:
        _COMPILED.clear()
    _COMPILED[id(rules)] = (rules, (files, folders) if plain else None)
    return (files, folders) if plain else None


def _lookup(clean: str, compiled: _Compiled) -> str:
    files, folders = compiled
    # An exact file rule beats a folder rule of the same length, and a folder is never longer than the path.
    zone = files.get(clean)
    if zone is not None:
        return zone
    # Folder rule "a/b/" matches "a/b" and everything below it: look up the path and each of its ancestors,
    # longest first (the most specific rule wins).
    head = clean[:-1] if clean.endswith("/") else clean
    while head:
        zone = folders.get(head)
        if zone is not None:
            return zone
        cut = head.rfind("/")
        if cut < 0:
            break
        head = head[:cut]
    return PROJECT


def zones_below(path: str, rules: Iterable[ZoneRule] = DEFAULT_RULES) -> frozenset[str]:
    """Every zone a folder scope may touch: its own zone plus those of more specific rules inside it.

    ``profil/`` is kernel but contains personal files, so work scoped to ``profil/`` touches both.
    """
    clean = normalize(path)
    rules = tuple(rules)
    zones = {zone_of(clean, rules)}
    if clean == "" or clean.endswith("/"):
        for rule in rules:
            if clean == "" or rule.prefix.startswith(clean):
                zones.add(rule.zone)
    return frozenset(zones)


def merge_rules(extra: Iterable[ZoneRule], base: Iterable[ZoneRule] = DEFAULT_RULES) -> tuple[ZoneRule, ...]:
    """A brain's own rules (``profil/zones.yml``) on top of the defaults; same prefix → brain wins."""
    extra = tuple(extra)
    overridden = {r.prefix for r in extra}
    return tuple(r for r in base if r.prefix not in overridden) + extra
