"""An agent's live context: each thread's handoff.md, written after a HANDOFF or CHECKPOINT, at rotation (at most
once a minute) and when read; what runners give the agent, never the transcript."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ambient.core.errors import UnsafePathError
from ambient.live.context import HANDOFF_MAX_AGE_S, LiveContext
from ambient.live.handoff import HANDOFF_MAX_CHARS, RUBRICS
from ambient.live.turn import Turn, check_agent_name
from ambient.storage.paths import BrainPaths
from tests.unit.live.helpers import turn


@pytest.fixture
def live(tmp_path: Path) -> LiveContext:
    """Live threads of a fresh brain."""
    return LiveContext(BrainPaths(tmp_path))


class TestAppends:
    def test_batched_appends_equal_one_by_one(self, tmp_path: Path) -> None:
        """append_turns (the daemon's batch path) writes what append_turn would: same files, same rotations."""

        def turns() -> list[Turn]:
            out = []
            for i in range(40):
                out.append(turn(text=f"turn {i:03d} " + "z" * 150, minutes=i, target="qa" if i % 3 else "dev"))
            out.insert(17, turn("HANDOFF", text="over to you", minutes=17))
            return out

        one = LiveContext(BrainPaths(tmp_path / "one"), max_bytes=2048, keep=3)
        for t in turns():
            one.append_turn(t)
        many = LiveContext(BrainPaths(tmp_path / "many"), max_bytes=2048, keep=3)
        many.append_turns(turns()[:25])
        many.append_turns(turns()[25:])
        for agent in ("qa", "dev"):
            a, b = one.paths.live / agent, many.paths.live / agent
            assert sorted(p.name for p in a.glob("log*.jsonl")) == sorted(p.name for p in b.glob("log*.jsonl"))
            for f in a.glob("log*.jsonl"):
                assert f.read_bytes() == (b / f.name).read_bytes()
                assert f.stat().st_size <= 2048
            assert [t.text for t in one.turns(agent)] == [t.text for t in many.turns(agent)]
        assert (many.paths.live / "qa" / "handoff.md").exists()  # the HANDOFF turn rewrote it

    def test_a_rotation_writes_the_handoff(self, tmp_path: Path) -> None:
        """Past max_bytes the log rotates, and handoff.md is written: the summary outlives the rotated turns."""
        live = LiveContext(BrainPaths(tmp_path), max_bytes=2048, keep=2)
        for i in range(60):
            live.append_turn(turn(text=f"turn {i:03d} " + "z" * 200, minutes=i))
        d = live.paths.live / "qa"
        assert (d / "log.1.jsonl").exists() and (d / "handoff.md").exists()

    def test_a_rotation_rewrites_the_handoff_at_most_once_a_minute(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Rotations in a burst (a fan-out rotates every ~1,700 items) rewrite handoff.md once; one that comes
        HANDOFF_MAX_AGE_S after the last rewrite rewrites it again, and a CHECKPOINT always does."""
        live = LiveContext(BrainPaths(tmp_path), max_bytes=2048, keep=2)
        calls = {"rotate": 0, "handoff": 0}
        rotate, write = LiveContext._rotate, LiveContext._write_handoff

        def counting_rotate(self: LiveContext, d: Path) -> None:
            calls["rotate"] += 1
            rotate(self, d)

        def counting_write(self: LiveContext, agent: str) -> str:
            calls["handoff"] += 1
            return write(self, agent)

        monkeypatch.setattr(LiveContext, "_rotate", counting_rotate)
        monkeypatch.setattr(LiveContext, "_write_handoff", counting_write)
        handoff = live.paths.live / "qa" / "handoff.md"
        for i in range(50):
            live.append_turn(turn(text=f"first {i:03d} " + "z" * 200, minutes=i))
        assert calls["rotate"] >= 4 and calls["handoff"] == 1  # the first rotation wrote it, the others did not
        first = handoff.read_text()
        aged = time.time() - HANDOFF_MAX_AGE_S - 1
        os.utime(handoff, (aged, aged))
        rotations = calls["rotate"]
        while calls["rotate"] == rotations:
            live.append_turn(turn(text="after " + "z" * 200, minutes=60))
        assert calls["handoff"] == 2 and handoff.read_text() != first
        second = handoff.read_text()
        live.append_turn(turn(signal="CHECKPOINT", text="checkpoint now", minutes=99))
        assert calls["handoff"] == 3 and handoff.read_text() != second

    @pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "a\\b", "x\x00y", "a..b", "n" * 65, ".hidden"])
    def test_agent_names_cannot_traverse(self, live: LiveContext, name: str) -> None:
        """Agent names with separators, '..', NUL or too long are refused before any path is built."""
        with pytest.raises(UnsafePathError):
            check_agent_name(name)
        with pytest.raises(UnsafePathError):
            live.view(name)
        with pytest.raises(UnsafePathError):
            live.handoff_for(name)
        with pytest.raises(ValueError, match="agent name"):
            turn(target=name)
        assert not (live.paths.root.parent / "x").exists()


class TestHandoff:
    def test_checkpoint_writes_the_rubrics(self, live: LiveContext) -> None:
        """A CHECKPOINT rewrites handoff.md with the stable rubrics filled from the thread."""
        live.append_turn(turn(requester="main", corr="c1", text="check the deploy of instance-03"))
        live.append_turn(turn(requester="architect", corr="c2", text="review the lock design", minutes=1))
        live.append_turn(turn("RETURN", requester="main", role="agent", corr="c1", text="instance-03 ok", minutes=2))
        live.append_turn(
            turn(
                "BLOCKED_ON",
                requester="orchestrator",
                role="agent",
                corr="c3",
                text="missing vps/configs/x.yml",
                minutes=3,
            )
        )
        live.append_turn(
            turn(
                "HANDOFF",
                requester="qa",
                corr="c4",
                text="",
                minutes=4,
                payload={"decision": "use flock guards", "context": {"objective": "ship v2"}},
            )
        )
        text = (live.paths.live / "qa" / "handoff.md").read_text()
        positions = [text.index(f"## {r}") for r in RUBRICS]
        assert positions == sorted(positions)
        objective = text.split("## Current objective")[1].split("##")[0]
        assert "ship v2" in objective
        active = text.split("## Active requests (per requester)")[1].split("##")[0]
        assert "architect" in active and "review the lock design" in active
        assert "- main" not in active  # answered
        assert "use flock guards" in text.split("## Recent decisions")[1].split("##")[0]
        assert "missing vps/configs/x.yml" in text.split("## Blockers")[1].split("##")[0]
        assert "instance-03 ok" in text.split("## Last correlated answer")[1]
        assert live.handoff_for("qa") == text

    def test_handoff_without_file_is_summarised_once_and_kept(
        self, live: LiveContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before any HANDOFF or CHECKPOINT, handoff_for summarises the thread (never the transcript) and keeps
        the summary as handoff.md: the next reads parse no turn. An agent without a thread gets no folder."""
        live.append_turn(turn(text="secret transcript detail " * 400))
        summaries: list[str] = []
        real = live.recent_turns
        monkeypatch.setattr(live, "recent_turns", lambda agent, *a: (summaries.append(agent), real(agent, *a))[1])
        text = live.handoff_for("qa")
        assert len(text) <= HANDOFF_MAX_CHARS and "## Current objective" in text
        assert (live.paths.live / "qa" / "handoff.md").read_text() == text and summaries == ["qa"]
        live.append_turn(turn(text="a newer request", minutes=1))
        assert live.handoff_for("qa") == text and summaries == ["qa"]  # read back, not summarised again
        assert "(none recorded)" in live.handoff_for("nobody") and not (live.paths.live / "nobody").exists()

    def test_an_old_handoff_is_rebuilt_when_turns_came_since(self, live: LiveContext) -> None:
        """A handoff.md read more than HANDOFF_MAX_AGE_S after it was written, with turns appended since, is
        rebuilt first; without new turns, or while it is recent, it is read as it is."""
        live.append_turn(turn(requester="main", corr="c1", text="deploy instance-01"))
        first = live.handoff_for("qa")
        handoff = live.paths.live / "qa" / "handoff.md"
        old = time.time() - HANDOFF_MAX_AGE_S - 5
        os.utime(handoff, (old, old))
        os.utime(live.paths.live / "qa" / "log.jsonl", (old - 1, old - 1))
        assert live.handoff_for("qa") == first and handoff.stat().st_mtime == old  # nothing new: kept
        live.append_turn(turn(requester="architect", corr="c2", text="review the lock design", minutes=1))
        os.utime(handoff, (time.time() - 1, time.time() - 1))
        assert live.handoff_for("qa") == first  # recent: kept, even with a newer turn
        os.utime(handoff, (old, old))
        rebuilt = live.handoff_for("qa")
        assert "review the lock design" in rebuilt and "review the lock design" not in first
        assert handoff.read_text() == rebuilt

    def test_a_handoff_that_cannot_be_written_is_still_given(
        self, live: LiveContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """handoff.md cannot be written (disk full): the agent still gets the summary, nothing is raised, and the
        next read tries again."""
        import errno

        import ambient.live.context as lc_mod

        live.append_turn(turn(text="deploy instance-01"))

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(lc_mod, "atomic_write", full)
        text = live.handoff_for("qa")
        assert "deploy instance-01" in text and not (live.paths.live / "qa" / "handoff.md").exists()
        monkeypatch.undo()
        assert live.handoff_for("qa") == text and (live.paths.live / "qa" / "handoff.md").read_text() == text

    def test_a_handoff_that_is_a_symlink_is_not_replaced(self, live: LiveContext, tmp_path: Path) -> None:
        """handoff.md replaced by a symlink: the agent still gets a summary, and the link is left alone."""
        live.append_turn(turn(text="first"))
        target = tmp_path / "elsewhere.md"
        target.write_text("not a handoff")
        (live.paths.live / "qa" / "handoff.md").symlink_to(target)
        assert "## Current objective" in live.handoff_for("qa")
        assert (live.paths.live / "qa" / "handoff.md").is_symlink() and target.read_text() == "not a handoff"

    def test_oversized_handoff_file_is_cut(self, live: LiveContext) -> None:
        """A handoff.md edited to be huge is still given bounded."""
        d = live.paths.live / "qa"
        d.mkdir(parents=True)
        (d / "handoff.md").write_text("é" * 10_000)
        assert len(live.handoff_for("qa")) == HANDOFF_MAX_CHARS


def test_a_handoff_naming_a_run_that_ended_is_rebuilt_when_read(tmp_path: Path) -> None:
    """handoff.md written while a run was open names its question; once the run ends, the next read rebuilds it
    without it. One that names no run that ended is served as it is."""
    ended: set[str] = set()
    live = LiveContext(BrainPaths(tmp_path), settled=ended.__contains__)
    run = "sess-20260318-1000-tone-0001"
    live.append_turn(turn(requester="ambient", corr=f"{run}/ask-a/1", text="write ask-a"))
    live.append_turn(turn("ESCALATE", requester="ambient", role="agent", corr=f"{run}/ask-a/1", text="which tone?"))
    live.append_turn(turn("HANDOFF", requester="qa", corr="c4", text="", payload={"context": {"objective": "tone"}}))
    path = live.paths.live / "qa" / "handoff.md"
    assert run in path.read_text() and live.handoff_for("qa") == path.read_text()  # open: kept, not rebuilt
    ended.add(run)
    text = live.handoff_for("qa")
    assert run not in text and "which tone?" not in text and "tone" in text
    assert path.read_text() == text  # kept as handoff.md
    fresh = LiveContext(BrainPaths(tmp_path), settled=ended.__contains__)  # a new daemon: rebuilt once
    assert fresh.handoff_for("qa") == text
    unknown = LiveContext(BrainPaths(tmp_path))  # `ambient thread`: nothing known to have ended, the file as it is
    assert unknown.handoff_for("qa") == text
