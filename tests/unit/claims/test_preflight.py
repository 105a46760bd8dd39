"""Pre-flight: the six checks with the source's codes, the circuit breaker, and the snapshot read from disk."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.claims import preflight as P
from ambient.claims.breakers import Breaker
from ambient.claims.claim import Claim, new_claim
from ambient.claims.locks import LockManager
from ambient.claims.preflight import BreakerState, LockView, Snapshot, check, exit_code
from ambient.claims.snapshot import agent_zone_access, build_snapshot, current_branch, run_preflight
from ambient.claims.store import ClaimStore
from ambient.core.errors import InputError
from ambient.storage.paths import BrainPaths

NOW = datetime(2026, 3, 16, 21, 0, tzinfo=UTC)


def mk(sid: str, status: str = "open", **fields: Any) -> Claim:
    doc: dict[str, Any] = {
        "sess_id": sid,
        "type": "satellite",
        "scope": fields.pop("scope", "brain-engine/"),
        "agent": fields.pop("agent", "coder"),
        "status": status,
        "opened_at": "2026-03-16T20:00",
    }
    doc.update(fields)
    return Claim.model_validate(doc)


def snap(*claims: Claim, **kw: Any) -> Snapshot:
    return Snapshot(claims={c.sess_id: c for c in claims}, **kw)


def codes(problems: list[P.PreflightProblem]) -> list[int]:
    return [p.code for p in problems]


class TestChecks:
    def test_all_clear(self) -> None:
        """An open claim writing inside its scope, unlocked, on the right branch: no problem, exit 0."""
        problems = check(snap(mk("s", theme_branch="theme/x"), branch="theme/x"), "s", "brain-engine/src/a.py")
        assert problems == [] and exit_code(problems) == 0

    @pytest.mark.parametrize(
        ("file", "scope", "ok"),
        [
            ("brain-engine/a.py", "brain-engine/", True),
            ("brain-engine", "brain-engine/", True),
            ("brain-engine-2/a.py", "brain-engine/", False),
            ("agents/x.md", "brain-engine/", False),
            ("README.md", "README.md", True),
            ("README.md.bak", "README.md", False),
            ("../etc/passwd", "brain-engine/", False),
            ("/etc/passwd", "brain-engine/", False),
            ("x.md", "../outside/", False),
        ],
    )
    def test_1_scope(self, file: str, scope: str, ok: bool) -> None:
        """Code 1: the file must be inside the claim's scope and inside the brain."""
        problems = check(snap(mk("s", scope=scope)), "s", file)
        assert (1 not in codes(problems)) is ok

    def test_2_locked_by_another_holder(self) -> None:
        """Code 2: a live lock of another holder on the file or a folder above it; own and expired locks pass."""
        claim = mk("s")
        other = LockView(file="brain-engine/a.py", state="held", holder="sess-other", expires_at="2026-03-16T22:00")
        folder = LockView(file="brain-engine/", state="held", holder="sess-other")
        mine = LockView(file="brain-engine/b.py", state="held", holder="s")
        gone = LockView(file="brain-engine/c.py", state="expired", holder="sess-other")
        bad = LockView(file="brain-engine/d.py", state="malformed", problem="is empty")
        locks = (other, mine, gone, bad)
        assert codes(check(snap(claim, locks=locks), "s", "brain-engine/a.py")) == [2]
        assert "locked by sess-other" in check(snap(claim, locks=locks), "s", "brain-engine/a.py")[0].message
        assert codes(check(snap(claim, locks=locks), "s", "brain-engine/b.py")) == []
        assert codes(check(snap(claim, locks=locks), "s", "brain-engine/c.py")) == []
        assert codes(check(snap(claim, locks=locks), "s", "brain-engine/d.py")) == [2]
        assert codes(check(snap(claim, locks=(folder,)), "s", "brain-engine/deep/x.py")) == [2]

    def test_3_breaker(self) -> None:
        """Code 3: the breaker of the claim's scope is tripped (at the threshold, or latched)."""
        claim = mk("s", scope="./brain-engine//")
        two = {"brain-engine/": BreakerState(fails=2)}
        assert codes(check(snap(claim, breakers=two), "s", "brain-engine/a")) == []
        assert codes(check(snap(claim, breakers=two, threshold=2), "s", "brain-engine/a")) == [3]
        latched = {"brain-engine/": BreakerState(fails=0, tripped=True)}
        assert codes(check(snap(claim, breakers=latched), "s", "brain-engine/a")) == [3]

    @pytest.mark.parametrize("status", ["waiting_human", "paused", "closed", "failed", "stale"])
    def test_4_claim_not_open(self, status: str) -> None:
        """Code 4: only an open claim may write."""
        assert codes(check(snap(mk("s", status)), "s", "brain-engine/a")) == [4]

    def test_4_missing_claim_and_ancestors(self) -> None:
        """Code 4: no claim at all, or a parent/grandparent paused or failed."""
        assert codes(check(snap(), "nope", "brain-engine/a")) == [4]
        for bad in ("paused", "failed"):
            family = snap(mk("gp", bad), mk("p", parent_satellite="gp"), mk("s", parent_satellite="p"))
            problems = check(family, "s", "brain-engine/a")
            assert codes(problems) == [4] and f"under gp, which is {bad}" in problems[0].message
        assert codes(check(snap(mk("p", "waiting_human"), mk("s", parent_satellite="p")), "s", "brain-engine/a")) == []

    def test_5_zone(self) -> None:
        """Code 5: rendering mode writes project only; personal is the owner's; the agent's zone_access binds."""
        render = mk("s", scope="", mode="rendering")
        assert codes(check(snap(render), "s", "agents/x.md")) == [5]
        assert codes(check(snap(render), "s", "todo/x.md")) == []
        guest = mk("s", scope="profil/", user_id="client-42")
        assert codes(check(snap(guest), "s", "profil/capital.md")) == [5]
        assert codes(check(snap(mk("s", scope="profil/")), "s", "profil/capital.md")) == []
        kernel_only = {"coder": frozenset({"project"})}
        assert codes(check(snap(mk("s", scope="agents/"), agent_zones=kernel_only), "s", "agents/a.md")) == [5]
        assert (
            codes(check(snap(mk("s", scope="agents/"), agent_zones={"coder": frozenset({"*"})}), "s", "agents/a.md"))
            == []
        )

    def test_6_theme_branch(self) -> None:
        """Code 6: the claim (or an ancestor) names a theme branch and the brain is elsewhere or unknown."""
        own = mk("s", theme_branch="theme/be6")
        assert codes(check(snap(own, branch="main"), "s", "brain-engine/a")) == [6]
        assert codes(check(snap(own, branch=None), "s", "brain-engine/a")) == [6]
        inherited = snap(mk("p", theme_branch="theme/be6"), mk("s", parent_satellite="p"), branch="main")
        assert codes(check(inherited, "s", "brain-engine/a")) == [6]
        assert codes(check(snap(mk("s"), branch="whatever"), "s", "brain-engine/a")) == []

    def test_several_problems_exit_with_the_lowest_code(self) -> None:
        """Problems come sorted by code and the exit code is the lowest one."""
        claim = mk("s", "paused", theme_branch="theme/x")
        problems = check(snap(claim, branch="main"), "s", "agents/x.md")
        assert codes(problems) == [1, 4, 6] and exit_code(problems) == 1
        assert str(problems[0]).startswith("[1 scope] ")

    def test_snapshot_is_immutable(self) -> None:
        """A snapshot does not change when the dict it was built from does."""
        claims = {"s": mk("s")}
        s = Snapshot(claims=claims)
        claims.clear()
        assert "s" in s.claims
        with pytest.raises(TypeError):
            s.claims["x"] = mk("x")  # type: ignore[index]


class TestBreakerRules:
    def test_fail_success_reset(self) -> None:
        """Failures count up and trip at the threshold; a success resets only an untripped breaker."""
        state = BreakerState()
        for _ in range(2):
            state = P.breaker_fail(state, NOW)
        assert state.fails == 2 and not state.is_tripped()
        assert P.breaker_success(state) == BreakerState()
        state = P.breaker_fail(state, NOW + timedelta(minutes=1))
        assert state.tripped and state.tripped_at == "2026-03-16T21:01:00+00:00"
        assert P.breaker_success(state) is state
        with pytest.raises(ValueError, match="at least 1"):
            P.breaker_fail(state, NOW, threshold=0)


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    for sub in ("claims", "locks", "agents"):
        (root / sub).mkdir(parents=True)
    return BrainPaths(root)


class TestShell:
    def test_breaker_persists_and_is_shared(self, brain: BrainPaths) -> None:
        """Breaker counts live in .ambient/breaker.json, shared by instances; a tripped one waits for reset."""
        a = Breaker(brain)
        assert [a.fail("be/") for _ in range(3)] == [1, 2, 3]
        b = Breaker(brain)
        assert b.tripped("./be//") and b.status("be/").tripped_at is not None
        b.success("be/")
        assert a.tripped("be/")
        a.reset("be/")
        assert not b.tripped("be/") and b.states() == {}
        b.fail("x/")
        b.success("x/")
        assert b.states() == {}
        assert Breaker(brain, threshold=1).fail("y/") == 1 and Breaker(brain, threshold=1).tripped("y/")

    def test_corrupt_breaker_file_is_an_error(self, brain: BrainPaths) -> None:
        """An unreadable breaker.json is reported, never read as 'nothing tripped'."""
        brain.state.mkdir()
        (brain.state / "breaker.json").write_text("{not json")
        with pytest.raises(InputError, match=r"breaker\.json"):
            Breaker(brain).states()
        with pytest.raises(InputError, match="at least 1"):
            Breaker(brain, threshold=0)

    def test_current_branch(self, brain: BrainPaths, tmp_path: Path) -> None:
        """The branch comes from .git/HEAD (here or above, or a worktree's gitdir); detached or none is None."""
        assert current_branch(brain.root) is None
        git = brain.root / ".git"
        git.mkdir()
        (git / "HEAD").write_text("ref: refs/heads/theme/be6\n")
        assert current_branch(brain.root) == "theme/be6"
        assert current_branch(brain.root / "claims") == "theme/be6"
        (git / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
        assert current_branch(brain.root) is None
        wt = tmp_path / "wt"
        wt.mkdir()
        (wt / ".git").write_text(f"gitdir: {git}\n")
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        assert current_branch(wt) == "main"

    def test_agent_zone_access(self, brain: BrainPaths) -> None:
        """zone_access is read from the agent's frontmatter (brain.ipc or ipc); missing or bad gives None."""
        (brain.agents / "a.md").write_text("---\nbrain:\n  ipc:\n    zone_access: [kernel, project]\n---\nbody\n")
        (brain.agents / "b.md").write_text("---\nipc:\n  zone_access: project\n---\n")
        (brain.agents / "c.md").write_text("no frontmatter\n")
        assert agent_zone_access(brain, "a") == {"kernel", "project"}
        assert agent_zone_access(brain, "b") == {"project"}
        assert agent_zone_access(brain, "c") is None and agent_zone_access(brain, "../x") is None

    def test_run_preflight_on_a_real_brain(self, brain: BrainPaths) -> None:
        """run_preflight reads claims, locks, breakers, branch and agents from disk and applies the six checks."""
        store = ClaimStore(brain)
        store.open(new_claim("s", "satellite", "brain-engine/", "coder", NOW, theme_branch="theme/be6"))
        (brain.root / ".git").mkdir()
        (brain.root / ".git" / "HEAD").write_text("ref: refs/heads/theme/be6\n")
        assert run_preflight(brain, "s", "brain-engine/a.py") == []
        locks = LockManager(brain)
        locks.acquire("brain-engine/a.py", "sess-other")
        assert codes(run_preflight(brain, "s", "brain-engine/a.py")) == [2]
        locks.acquire("brain-engine/b.py", "s")
        assert codes(run_preflight(brain, "s", "brain-engine/b.py")) == []
        for _ in range(3):
            Breaker(brain).fail("brain-engine/")
        assert codes(run_preflight(brain, "s", "brain-engine/b.py")) == [3]
        Breaker(brain).reset("brain-engine/")
        (brain.agents / "coder.md").write_text("---\nipc:\n  zone_access: [kernel]\n---\n")
        assert codes(run_preflight(brain, "s", "brain-engine/b.py")) == [5]
        snapshot = build_snapshot(brain, agent_zones={})
        assert codes(run_preflight(brain, "s", "brain-engine/b.py", snapshot=snapshot)) == []
        locks.close()

    @pytest.mark.slow
    def test_run_preflight_reads_only_the_claim_and_its_ancestors(
        self, brain: BrainPaths, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """claims/ only grows: pre-flight parses the claim and its ancestors, not every file, and gives the same
        verdicts as a snapshot of every claim (paused parent, theme branch above, agent zones, missing claim)."""
        store = ClaimStore(brain)
        pilote = new_claim("sess-pilote", "pilote", "brain-engine/", "ambient", NOW, theme_branch="theme/be6")
        store.open(pilote)
        store.open(
            new_claim("sess-coord", "coordinator", "brain-engine/", "ambient", NOW, parent_satellite="sess-pilote")
        )
        store.open(new_claim("sess-leaf", "satellite", "brain-engine/x/", "coder", NOW, parent_satellite="sess-coord"))
        for k in range(60):
            done = new_claim(f"sess-done-{k:03d}", "satellite", "brain-engine/x/", "tester", NOW)
            store.write_claim(done.model_copy(update={"status": "closed"}), durable=False)
        (brain.agents / "coder.md").write_text("---\nipc:\n  zone_access: [project]\n---\n")
        (brain.root / ".git").mkdir()
        (brain.root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        parsed: list[str] = []
        real_read = ClaimStore.read

        def counting(self: ClaimStore, path: Path) -> Any:
            parsed.append(path.name)
            return real_read(self, path)

        monkeypatch.setattr(ClaimStore, "read", counting)
        cases = [
            ("sess-leaf", "brain-engine/x/a.py"),
            ("sess-leaf", "brain-engine/y.py"),
            ("sess-coord", "k/a.md"),
            ("sess-missing", "brain-engine/x/a.py"),
            ("sess-done-007", "brain-engine/x/b.py"),
        ]
        for sess, file in cases:
            parsed.clear()
            lean = run_preflight(brain, sess, file)
            # The claim and its two ancestors at most; a claim not in its usual file is looked for in every one.
            assert len(parsed) <= 3 or sess == "sess-missing", parsed
            full = run_preflight(brain, sess, file, snapshot=build_snapshot(brain))
            assert lean == full and lean, (sess, file)  # every case has something to report
        store.transition("sess-coord", "pause", now=NOW)
        paused = run_preflight(brain, "sess-leaf", "brain-engine/x/a.py")
        assert [p.message for p in paused][1:] == [
            "claim sess-leaf sits under sess-coord, which is paused",
            "claim sess-leaf works on theme/be6, but the brain is on main",
        ]
        assert paused == run_preflight(brain, "sess-leaf", "brain-engine/x/a.py", snapshot=build_snapshot(brain))

    def test_symlink_out_of_the_brain_fails_scope(self, brain: BrainPaths, tmp_path: Path) -> None:
        """A path that is a symlink leading out of the brain fails the scope check (S-02)."""
        ClaimStore(brain).open(new_claim("s", "satellite", "brain-engine/", "coder", NOW))
        (brain.root / "brain-engine").mkdir()
        outside = tmp_path / "outside"
        outside.mkdir()
        os.symlink(outside, brain.root / "brain-engine" / "out")
        problems = run_preflight(brain, "s", "brain-engine/out/secret")
        assert codes(problems) == [1] and "outside the brain root" in problems[0].message
        assert codes(run_preflight(brain, "s", "../x")) == [1]
