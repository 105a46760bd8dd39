"""The live threads on disk: one shared thread per agent, filtered views, rotation, torn lines, the tail read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient.live.threads import Threads
from ambient.storage.paths import BrainPaths
from tests.unit.live.helpers import T0, packet, turn


@pytest.fixture
def threads(tmp_path: Path) -> Threads:
    """Live threads of a fresh brain."""
    return Threads(BrainPaths(tmp_path))


class TestThread:
    def test_one_thread_shared_by_all_requesters(self, threads: Threads) -> None:
        """Turns from different requesters land in the one canonical log of the target agent."""
        threads.append_packet(packet("SPAWN", "main", "qa", context={"objective": "keep IDEA-TOKEN-7F3A"}), ts=T0)
        threads.append_packet(packet("SPAWN", "architect", "qa", session="sess-2", context="what token?"), ts=T0)
        threads.append_packet(packet("RETURN", "qa", "architect", session="sess-2", result="IDEA-TOKEN-7F3A"), ts=T0)
        files = sorted(p.name for p in (threads.paths.live / "qa").iterdir())
        assert files == ["log.jsonl", "thread.lock"]
        view = threads.view("qa")
        assert [t.requester for t in view.turns] == ["main", "architect", "architect"]
        assert not view.partial and view.total == 3

    def test_pair_view_is_partial(self, threads: Threads) -> None:
        """The pair view is a filtered projection and says it is partial, with how much it hides."""
        for i, who in enumerate(["main", "architect", "main"]):
            threads.append_turn(turn(requester=who, corr=f"c{i}", minutes=i))
        view = threads.view("qa", requester="main")
        assert [t.correlation_id for t in view.turns] == ["c0", "c2"]
        assert view.partial and view.total == 3
        assert "partial view (requester main)" in view.note and "1 of its 3 turns are not shown" in view.note

    def test_correlation_view(self, threads: Threads) -> None:
        """A correlation view keeps one request and its answers."""
        threads.append_turn(turn(corr="a"))
        threads.append_turn(turn("RETURN", role="agent", corr="a", text="done", minutes=1))
        threads.append_turn(turn(corr="b", minutes=2))
        view = threads.view("qa", correlation="a")
        assert [t.signal for t in view.turns] == ["SPAWN", "RETURN"] and view.partial
        assert view.to_json()["shown"] == 2

    def test_rotation_keeps_k_files_and_the_newest_turns(self, tmp_path: Path) -> None:
        """Past max_bytes the log rotates to log.N.jsonl; at most K rotated files are kept, newest turns first."""
        threads = Threads(BrainPaths(tmp_path), max_bytes=2048, keep=2)
        for i in range(60):
            threads.append_turn(turn(text=f"turn {i:03d} " + "z" * 200, minutes=i))
        d = threads.paths.live / "qa"
        names = sorted(p.name for p in d.glob("log*.jsonl"))
        assert names == ["log.1.jsonl", "log.2.jsonl", "log.jsonl"]
        assert all(p.stat().st_size <= 2048 for p in d.glob("log*.jsonl"))
        texts = [t.text[:8] for t in threads.turns("qa")]
        assert texts[-1] == "turn 059" and texts == sorted(texts)
        assert len(texts) < 60  # the oldest rotated file left

    def test_torn_last_line_does_not_swallow_the_next_turn(self, threads: Threads) -> None:
        """After a crash mid-append, the next turn starts on its own line; the torn bytes are skipped."""
        threads.append_turn(turn(corr="a"))
        log = threads.paths.live / "qa" / "log.jsonl"
        with log.open("a") as fh:
            fh.write('{"ts": "2026-03-18T10:0')
        threads.append_turn(turn(corr="b", minutes=1))
        view = threads.view("qa")
        assert [t.correlation_id for t in view.turns] == ["a", "b"]
        assert view.skipped_lines == 1


def test_recent_turns_are_the_newest_lines_across_a_rotation(tmp_path: Path) -> None:
    """The handoff's turns come from the tail of the two newest files: the newest ``limit`` lines, oldest first,
    without the torn last line or a corrupt line (what the full read skips too)."""
    threads = Threads(BrainPaths(tmp_path), max_bytes=4096, keep=3)
    for i in range(40):
        threads.append_turn(turn(text=f"turn {i:03d} " + "z" * 100, minutes=i))
    d = threads.paths.live / "qa"
    assert (d / "log.1.jsonl").exists()
    with (d / "log.jsonl").open("a") as fh:
        fh.write("not json\n\n")
    with (d / "log.jsonl").open("a") as fh:
        fh.write('{"ts": "2026-03-18T10:0')  # torn: a crash mid-append
    two_newest = threads.log_files("qa")[-2:]
    every = [t.text[:8] for t in threads._read(two_newest)[0]]
    assert [t.text[:8] for t in threads.recent_turns("qa", limit=1000)] == every
    newest = [t.text[:8] for t in threads.recent_turns("qa", limit=12)]
    assert newest == every[-11:]  # 12 lines: the corrupt one and the 11 newest turns
    assert newest[-1] == "turn 039"
    assert threads.recent_turns("nobody") == []


def _tail_reference(data: bytes, limit: int) -> list[bytes]:
    """The last ``limit`` complete, non-blank lines of ``data``, read the simple way (the whole file)."""
    lines = data.split(b"\n")[:-1]
    return [raw for raw in lines if raw.strip()][-limit:] if limit > 0 else []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.sampled_from([b"", b" ", b'{"a":1}', b"x" * 40, b"torn{", b"\xff\xfe"]), max_size=40),
    torn=st.sampled_from([b"", b'{"cut', b"  "]),
    limit=st.integers(0, 12),
    chunk=st.integers(1, 64),
)
@pytest.mark.slow
def test_tail_lines_reads_from_the_end_as_the_whole_file_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[bytes], torn: bytes, limit: int, chunk: int
) -> None:
    """_tail_lines reads the log backwards a chunk at a time (any chunk size, lines across chunk edges, blank
    lines, a torn tail) and returns what reading the whole file returns."""
    import ambient.live.threads as lc

    monkeypatch.setattr(lc, "_TAIL_CHUNK", chunk)
    data = b"".join(line + b"\n" for line in lines) + torn
    path = tmp_path / "log.jsonl"
    path.write_bytes(data)
    assert lc._tail_lines(path, limit) == _tail_reference(data, limit)
