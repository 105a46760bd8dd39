"""profil/routing.yml: format, narrowing only, widening entries reported at file:line; zones.yml; build_matrix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ambient.kernel.matrix import decide
from ambient.kernel.routing_table import build_matrix, load_routing, load_zone_rules
from ambient.kernel.zones import zone_of
from ambient.storage.paths import BrainPaths


@pytest.fixture
def brain(make_brain: Callable[..., Path]) -> Path:
    """A copy of the example brain."""
    return make_brain()


def write_routing(root: Path, text: str) -> None:
    """Replace the brain's routing table."""
    (root / "profil" / "routing.yml").write_text(text)


class TestExample:
    def test_example_routing_applies_cleanly(self, brain: Path) -> None:
        """The example routing table loads with no problem and narrows scribe to project work."""
        bm = build_matrix(BrainPaths(brain))
        assert bm.problems == []
        assert bm.routing is not None and len(bm.routing.routes) == 5
        m = bm.matrix
        assert decide(m, "scribe", "ambient", "RETURN", "project").allowed
        d = decide(m, "scribe", "ambient", "RETURN", "kernel")
        assert (d.allowed, d.rule) == (False, "routing") and "in zone kernel" in d.reasons[-1]
        assert decide(m, "scribe", "bsi", "CHECKPOINT", "project").allowed
        # the gates would let deploy answer the orchestrator agent; routing keeps that too, plus ambient
        assert decide(m, "deploy", "ambient", "ESCALATE", "project").allowed
        # senders without routes (ambient, human) keep their matrix rights
        assert decide(m, "ambient", "deploy", "SPAWN", "project", ["infrastructure/vps/configs/a.yml"]).allowed
        assert not decide(m, "ambient", "deploy", "SPAWN", "personal").allowed

    def test_no_routing_file(self, make_brain: Callable[..., Path]) -> None:
        """Without profil/routing.yml the matrix applies as is."""
        root = make_brain(example=False)
        assert load_routing(BrainPaths(root)) == (None, [])
        assert build_matrix(BrainPaths(root)).matrix.routing is None


class TestFormat:
    def test_forms(self, brain: Path) -> None:
        """to/signals/zones accept a single string or a list; '*' defers to the matrix; note is free text."""
        write_routing(
            brain,
            "version: 1\nroutes:\n"
            "  - from: deploy\n    to: ambient\n    signals: RETURN\n    note: only answers\n"
            "  - from: tester\n    to: '*'\n    signals: ['*']\n    zones: ['*']\n",
        )
        bm = build_matrix(BrainPaths(brain))
        assert bm.problems == []
        assert decide(bm.matrix, "deploy", "ambient", "RETURN").allowed
        assert decide(bm.matrix, "deploy", "ambient", "ERROR").rule == "routing"
        assert decide(bm.matrix, "deploy", "human", "RETURN").rule == "routing"
        assert decide(bm.matrix, "tester", "human", "ESCALATE", "project").allowed

    def test_widening_entry_reported_at_its_line(self, brain: Path) -> None:
        """An entry claiming more than the matrix is an error at file:line; the other entries apply."""
        write_routing(
            brain,
            "version: 1\n"
            "routes:\n"
            "  - from: deploy\n"
            "    to: [ambient]\n"
            "    signals: [SPAWN]\n"  # deploy does not emit SPAWN
            "  - from: coder\n"
            "    to: [ambient]\n"
            "    zones: [personal]\n"  # coder may not work in personal
            "  - from: tester\n"
            "    to: [coach]\n"  # coach receives from human only
            "  - from: vps\n"
            "    to: [ambient]\n",
        )
        bm = build_matrix(BrainPaths(brain))
        got = [(p.file, p.line, p.severity) for p in bm.problems]
        assert got == [
            ("profil/routing.yml", 3, "error"),
            ("profil/routing.yml", 6, "error"),
            ("profil/routing.yml", 9, "error"),
        ]
        assert "deploy does not emit SPAWN" in bm.problems[0].message
        assert "coder may not work in zone personal" in bm.problems[1].message
        assert "tester may send none of its signals to coach" in bm.problems[2].message
        m = bm.matrix
        assert decide(m, "vps", "ambient", "RETURN").allowed
        # not applied, and failing closed: deploy, coder and tester are still restricted
        for agent in ("deploy", "coder", "tester"):
            assert decide(m, agent, "ambient", "RETURN", "project").rule == "routing"

    def test_bad_entries(self, brain: Path) -> None:
        """Entries that do not validate are errors with their line; their sender stays restricted."""
        write_routing(
            brain,
            "version: 1\n"
            "routes:\n"
            "  - from: deploy\n"
            "    to: [ambient]\n"
            "    signals: [RETURN, PING]\n"
            "  - from: coder\n"
            "    too: [ambient]\n"
            "  - just a string\n"
            "  - from: vps\n"
            "    to: [ambient]\n",
        )
        bm = build_matrix(BrainPaths(brain))
        lines = [(p.line, p.message) for p in bm.problems]
        assert lines[0][0] == 5 and "'PING' is not a signal" in lines[0][1]
        assert any(line == 6 and "routes.1.to: Field required" in msg for line, msg in lines)
        assert any(line == 7 and "routes.1.too" in msg for line, msg in lines)
        assert any(line == 8 and "routes.2" in msg for line, msg in lines)
        assert decide(bm.matrix, "deploy", "ambient", "RETURN").rule == "routing"
        assert decide(bm.matrix, "coder", "ambient", "RETURN").rule == "routing"
        assert decide(bm.matrix, "vps", "ambient", "RETURN").allowed

    def test_default_deny(self, brain: Path) -> None:
        """default: deny restricts every sender, human and ambient included."""
        write_routing(brain, "version: 1\ndefault: deny\nroutes:\n  - from: ambient\n    to: [deploy]\n")
        m = build_matrix(BrainPaths(brain)).matrix
        assert decide(m, "ambient", "deploy", "SPAWN", "project").allowed
        assert decide(m, "human", "deploy", "SPAWN", "project").rule == "routing"

    @pytest.mark.parametrize(
        "text",
        [
            "routes: [unclosed\n",
            "version: 2\nroutes: []\n",
            "version: 1\ndefault: allow\n",
            "version: 1\nrouting: []\n",
            "- a\n",
            "a: &x 1\nb: *x\n",
        ],
    )
    def test_unusable_file_fails_closed(self, brain: Path, text: str) -> None:
        """A routing file that cannot be used is an error and denies every packet until fixed."""
        write_routing(brain, text)
        bm = build_matrix(BrainPaths(brain))
        assert bm.errors and all(p.file == "profil/routing.yml" for p in bm.errors)
        assert any("restricted to nothing" in p.message for p in bm.errors)
        assert decide(bm.matrix, "human", "deploy", "SPAWN", "project").rule == "routing"

    def test_empty_file(self, brain: Path) -> None:
        """An empty routing file restricts nobody."""
        write_routing(brain, "# nothing yet\n")
        bm = build_matrix(BrainPaths(brain))
        assert bm.problems == [] and decide(bm.matrix, "scribe", "ambient", "RETURN", "kernel").allowed


class TestZonesFile:
    def test_brain_zone_rules(self, brain: Path) -> None:
        """profil/zones.yml adds rules on top of the defaults; the most specific still wins."""
        (brain / "profil" / "zones.yml").write_text(
            "reference: [reference/, docs/books/]\npersonal: journal/\nkernel: ['../escape', '/abs']\nBad: [x/]\n"
        )
        rules, problems = load_zone_rules(BrainPaths(brain))
        assert zone_of("reference/a.md", rules) == "reference"
        assert zone_of("docs/books/x", rules) == "reference"
        assert zone_of("journal/2026.md", rules) == "personal"
        assert zone_of("profil/capital.md", rules) == "personal"
        assert [p.line for p in problems] == [3, 3, 4]

    def test_zones_used_by_the_matrix(self, brain: Path) -> None:
        """A file a brain rule puts in 'reference' is authorized by coach's reference zone."""
        (brain / "profil" / "zones.yml").write_text("reference: [reference/]\n")
        bm = build_matrix(BrainPaths(brain))
        assert decide(bm.matrix, "human", "coach", "SPAWN", None, ["reference/a.md"], bm.zone_rules).allowed

    def test_bad_zones_file(self, brain: Path) -> None:
        """An unreadable zones.yml keeps the default rules and says so."""
        (brain / "profil" / "zones.yml").write_text("- x\n")
        rules, problems = load_zone_rules(BrainPaths(brain))
        assert zone_of("projets/a", rules) == "project" and problems[0].line == 1
