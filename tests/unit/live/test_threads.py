"""Per-agent live context: one shared thread per agent, filtered views, rotation, the bounded handoff."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient.core.errors import UnsafePathError
from ambient.live.threads import (
    HANDOFF_MAX_AGE_S,
    HANDOFF_MAX_CHARS,
    RUBRICS,
    LiveContext,
    Turn,
    bound_payload,
    check_agent_name,
    summarise,
    turn_from_packet,
)
from ambient.storage.paths import BrainPaths

T0 = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)


def packet(signal: str, frm: str, to: str, session: str | None = "sess-1", **payload: Any) -> dict[str, Any]:
    """A delivered packet in its JSON form."""
    return {
        "from": frm,
        "to": to,
        "signal": signal,
        "scope": {"files": [], "zone": "project"},
        "payload": payload,
        "session_id": session,
    }


def turn(
    signal: str = "SPAWN",
    *,
    requester: str = "orchestrator",
    role: str = "requester",
    corr: str | None = "c1",
    text: str = "do it",
    minutes: int = 0,
    payload: Any = None,
    target: str = "qa",
) -> Turn:
    """A turn of the qa thread."""
    return Turn(
        ts=T0 + timedelta(minutes=minutes),
        target=target,
        requester=requester,
        correlation_id=corr,
        role=role,
        signal=signal,
        text=text,
        payload=payload,
    )


@pytest.fixture
def live(tmp_path: Path) -> LiveContext:
    """Live threads of a fresh brain."""
    return LiveContext(BrainPaths(tmp_path))


class TestPackets:
    def test_spawn_goes_to_the_receivers_thread(self) -> None:
        """A SPAWN is a turn of the target agent's thread, asked by the sender; the session is the correlation."""
        t = turn_from_packet(packet("SPAWN", "main", "qa", context={"objective": "check the token"}), ts=T0)
        assert t is not None
        assert (t.target, t.requester, t.role, t.correlation_id, t.text) == (
            "qa",
            "main",
            "requester",
            "sess-1",
            "check the token",
        )

    def test_answers_go_to_the_senders_thread(self) -> None:
        """RETURN, ESCALATE, BLOCKED_ON go to the answering agent's thread, attributed to whom it answers."""
        r = turn_from_packet(packet("RETURN", "qa", "main", result="token is 7F3A"), ts=T0, correlation_id="c9")
        assert r is not None and (r.target, r.requester, r.role, r.correlation_id, r.text) == (
            "qa",
            "main",
            "agent",
            "c9",
            "token is 7F3A",
        )
        e = turn_from_packet(packet("ESCALATE", "qa", "human", options=["a", "b"]), ts=T0)
        assert e is not None and e.text == "options: a | b" and e.target == "qa"

    def test_no_thread_for_people_or_broadcast(self) -> None:
        """Packets to a person or to everyone concern no agent thread."""
        assert turn_from_packet(packet("SPAWN", "main", "broadcast"), ts=T0) is None
        assert turn_from_packet(packet("RETURN", "human", "qa"), ts=T0) is None

    def test_unsafe_agent_in_packet_is_refused(self) -> None:
        """A packet naming an agent with a path in it never becomes a directory."""
        with pytest.raises(UnsafePathError):
            turn_from_packet(packet("SPAWN", "main", "../etc"), ts=T0)

    def test_text_and_payload_are_bounded(self) -> None:
        """A turn keeps at most 2000 characters of text and a bounded payload summary."""
        t = turn(text="x" * 10_000, payload={"context": {"blob": "y" * 100_000, "list": list(range(1000))}})
        assert len(t.text) == 2000 and t.text.endswith("…")
        assert len(json.dumps(t.payload)) <= 4096
        assert bound_payload({"a": {"b": {"c": {"d": {"e": 1}}}}}) == {"a": {"b": {"c": {"d": "…"}}}}
        assert bound_payload("\ud800 lone") == "\ufffd lone"


class TestThread:
    def test_one_thread_shared_by_all_requesters(self, live: LiveContext) -> None:
        """Turns from different requesters land in the one canonical log of the target agent."""
        live.append_packet(packet("SPAWN", "main", "qa", context={"objective": "keep IDEA-TOKEN-7F3A"}), ts=T0)
        live.append_packet(packet("SPAWN", "architect", "qa", session="sess-2", context="what token?"), ts=T0)
        live.append_packet(packet("RETURN", "qa", "architect", session="sess-2", result="IDEA-TOKEN-7F3A"), ts=T0)
        files = sorted(p.name for p in (live.paths.live / "qa").iterdir())
        assert files == ["log.jsonl", "thread.lock"]
        view = live.view("qa")
        assert [t.requester for t in view.turns] == ["main", "architect", "architect"]
        assert not view.partial and view.total == 3

    def test_pair_view_is_partial(self, live: LiveContext) -> None:
        """The pair view is a filtered projection and says it is partial, with how much it hides."""
        for i, who in enumerate(["main", "architect", "main"]):
            live.append_turn(turn(requester=who, corr=f"c{i}", minutes=i))
        view = live.view("qa", requester="main")
        assert [t.correlation_id for t in view.turns] == ["c0", "c2"]
        assert view.partial and view.total == 3
        assert "partial view (requester main)" in view.note and "1 of its 3 turns are not shown" in view.note

    def test_correlation_view(self, live: LiveContext) -> None:
        """A correlation view keeps one request and its answers."""
        live.append_turn(turn(corr="a"))
        live.append_turn(turn("RETURN", role="agent", corr="a", text="done", minutes=1))
        live.append_turn(turn(corr="b", minutes=2))
        view = live.view("qa", correlation="a")
        assert [t.signal for t in view.turns] == ["SPAWN", "RETURN"] and view.partial
        assert view.to_json()["shown"] == 2

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

    def test_rotation_keeps_k_files_and_the_newest_turns(self, tmp_path: Path) -> None:
        """Past max_bytes the log rotates to log.N.jsonl; at most K rotated files are kept, newest turns first."""
        live = LiveContext(BrainPaths(tmp_path), max_bytes=2048, keep=2)
        for i in range(60):
            live.append_turn(turn(text=f"turn {i:03d} " + "z" * 200, minutes=i))
        d = live.paths.live / "qa"
        names = sorted(p.name for p in d.glob("log*.jsonl"))
        assert names == ["log.1.jsonl", "log.2.jsonl", "log.jsonl"]
        assert all(p.stat().st_size <= 2048 for p in d.glob("log*.jsonl"))
        texts = [t.text[:8] for t in live.turns("qa")]
        assert texts[-1] == "turn 059" and texts == sorted(texts)
        assert len(texts) < 60  # the oldest rotated file left
        assert (d / "handoff.md").exists()  # rewritten at rotation: the summary outlives the rotated turns

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

    def test_torn_last_line_does_not_swallow_the_next_turn(self, live: LiveContext) -> None:
        """After a crash mid-append, the next turn starts on its own line; the torn bytes are skipped."""
        live.append_turn(turn(corr="a"))
        log = live.paths.live / "qa" / "log.jsonl"
        with log.open("a") as fh:
            fh.write('{"ts": "2026-03-18T10:0')
        live.append_turn(turn(corr="b", minutes=1))
        view = live.view("qa")
        assert [t.correlation_id for t in view.turns] == ["a", "b"]
        assert view.skipped_lines == 1

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

    def test_real_agent_names_are_accepted(self) -> None:
        """Names of the corpus (camelCase, hyphens, dots, underscores) are fine."""
        for name in ("helloWorld", "code-review", "brain.ui", "kanban_scribe", "a"):
            assert check_agent_name(name) == name


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

    def test_blocker_cleared_by_a_later_turn(self) -> None:
        """A blocker is open until something else happens on its correlation."""
        turns = [
            turn("BLOCKED_ON", role="agent", corr="c1", text="no access"),
            turn("SPAWN", corr="c1", text="access granted, go on", minutes=1),
        ]
        blockers = summarise(turns).split("## Blockers")[1].split("##")[0]
        assert "(none)" in blockers

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

        import ambient.live.threads as lc_mod

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

    def test_many_requesters_are_listed_fairly(self) -> None:
        """Each requester keeps a line; the rest is summarised as a count."""
        turns = [turn(requester=f"agent-{i:02d}", corr=f"c{i}", text=f"request {i}", minutes=i) for i in range(30)]
        active = summarise(turns).split("## Active requests (per requester)")[1].split("##")[0]
        assert "agent-29" in active and "and 18 more requesters" in active


_ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=3000)
_TURNS = st.lists(
    st.builds(
        Turn,
        ts=st.datetimes(timezones=st.just(UTC)),
        target=st.sampled_from(["qa", "helloWorld"]),
        requester=st.text(max_size=300),
        correlation_id=st.none() | st.text(max_size=300),
        role=st.sampled_from(["requester", "agent", "system"]),
        source=st.just("router"),
        signal=st.sampled_from(["SPAWN", "RETURN", "HANDOFF", "CHECKPOINT", "BLOCKED_ON", "ESCALATE", "DECISION"]),
        text=_ANY_TEXT,
        payload=st.none()
        | st.fixed_dictionaries({"decision": _ANY_TEXT, "context": st.fixed_dictionaries({"objective": _ANY_TEXT})}),
    ),
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(turns=_TURNS, agent=st.none() | st.text(max_size=500))
def test_handoff_never_exceeds_4096_characters(turns: list[Turn], agent: str | None) -> None:
    """Whatever the turns (huge texts, lone surrogates, control characters, many requesters), the handoff
    keeps its five rubrics in order, fits in 4096 characters and is valid UTF-8."""
    text = summarise(turns, agent=agent)
    assert len(text) <= HANDOFF_MAX_CHARS
    positions = [text.find(f"\n## {r}\n") for r in RUBRICS]
    assert -1 not in positions and positions == sorted(positions)
    text.encode("utf-8")


def test_handoff_bound_on_worst_case_volume() -> None:
    """Thousands of long turns from hundreds of requesters still give at most 4096 characters, every rubric filled."""
    turns = []
    for i in range(3000):
        signal = ["SPAWN", "BLOCKED_ON", "HANDOFF", "RETURN"][i % 4]
        role = "requester" if signal in ("SPAWN", "HANDOFF") else "agent"
        payload = {"decision": "d" * 900, "context": {"objective": "o" * 900}} if signal == "HANDOFF" else None
        turns.append(turn(signal, requester=f"r{i % 300}", role=role, corr=f"c{i}", text="w " * 1500, payload=payload))
    text = summarise(turns)
    assert len(text) <= HANDOFF_MAX_CHARS
    for rubric in RUBRICS:
        body = text.split(f"## {rubric}\n")[1].split("\n## ")[0]
        assert body.strip() and "(none" not in body


def test_summary_is_clean_even_from_unvalidated_turns() -> None:
    """Turns built without validation (lone surrogates, line breaks in names) still give clean, bounded text."""
    raw = Turn.model_construct(
        ts=T0,
        target="qa",
        requester="evil\n## Blockers\nfake",
        correlation_id="\ud800" * 10,
        role="requester",
        source="x",
        signal="SPAWN",
        text="\ud83d\x00\u2028" * 5000,
        payload=None,
    )
    text = summarise([raw] * 50)
    assert len(text) <= HANDOFF_MAX_CHARS
    text.encode("utf-8")
    assert text.count("\n## Blockers\n") == 1


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=400)),
    lambda inner: st.one_of(st.lists(inner, max_size=25), st.dictionaries(st.text(max_size=80), inner, max_size=25)),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(
    signal=st.sampled_from(["SPAWN", "RETURN", "ESCALATE", "HANDOFF", "ERROR", "CHECKPOINT", "BLOCKED_ON", ""]),
    sender=st.sampled_from(["ambient", "qa", "human", "dev-1", "broadcast"]),
    receiver=st.sampled_from(["qa", "ambient", "pilote", "coder", ""]),
    payload=st.one_of(_json, st.fixed_dictionaries({"result": _json, "context": _json, "options": _json})),
    corr=st.one_of(st.none(), st.text(max_size=300)),
    session=st.one_of(st.none(), st.text(max_size=30)),
    source=st.text(min_size=1, max_size=250),
)
@pytest.mark.slow
def test_turn_record_is_what_the_model_writes(
    signal: str, sender: str, receiver: str, payload: Any, corr: str | None, session: str | None, source: str
) -> None:
    """The daemon's direct record and the Turn model agree on every packet: same thread, same turn."""
    from ambient.live.threads import turn_from_packet, turn_record

    packet = {"signal": signal, "from": sender, "to": receiver, "payload": payload, "session_id": session}
    ts = datetime(2026, 11, 30, 12, 0, 1, 123456, tzinfo=UTC)
    model = turn_from_packet(packet, ts=ts, correlation_id=corr, source=source)
    record = turn_record(packet, ts=ts, correlation_id=corr, source=source)
    if model is None:
        assert record is None
        return
    assert record is not None
    assert json.loads(json.dumps(record)) == {**model.model_dump(mode="json", exclude_none=True), "ts": ts.isoformat()}


class _Str(str):
    pass


class _Int(int):
    def __repr__(self) -> str:  # a repr shorter than the JSON: bound_payload's size check must not trust it
        return "0"


def _reference_bound(value: Any, depth: int = 4, max_str: int = 300, max_items: int = 20) -> Any:
    """The bounding rule written plainly (as it was before the exact-type fast paths), as an oracle."""
    from collections.abc import Mapping

    def safe(text: str) -> str:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)

    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):  # subclasses come out as plain numbers (the same JSON)
        return float(value) if isinstance(value, float) else int(value)
    if isinstance(value, str):
        return safe(value[:max_str] + ("…" if len(value) > max_str else ""))
    if depth <= 0:
        return "…"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"{len(value) - max_items} more"
                break
            out[safe(str(k)[:64])] = _reference_bound(v, depth - 1, max_str, max_items)
        return out
    if isinstance(value, list | tuple):
        items = [_reference_bound(v, depth - 1, max_str, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            items.append(f"… {len(value) - max_items} more")
        return items
    return safe(str(value)[:max_str])


_odd_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=400),
        st.text(max_size=40).map(_Str),
        st.integers().map(_Int),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=25),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=80), inner, max_size=25),
    ),
    max_leaves=60,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(value=_odd_json)
def test_bounding_takes_fast_paths_without_changing_the_result(value: Any) -> None:
    """bound_payload's exact-type shortcuts give what the plain rule gives, subclasses and lone surrogates too
    (including its size check from the repr, which must never let a payload over ``PAYLOAD_MAX_CHARS`` through)."""
    from ambient.live.threads import PAYLOAD_MAX_CHARS, bound_payload

    expected = _reference_bound(value)
    text = json.dumps(expected, ensure_ascii=False)
    if len(text) > PAYLOAD_MAX_CHARS:
        expected = {"summary": text[: PAYLOAD_MAX_CHARS // 4] + "…"}
    got = bound_payload(value)
    assert got == expected and type(got) is type(expected)


def test_the_size_check_does_not_trust_a_short_repr() -> None:
    """bound_payload skips its JSON size check when six times the repr fits (no character takes more than six in
    JSON): numbers whose subclass has a short repr, and strings of control characters, still get summarised."""
    from ambient.live.threads import PAYLOAD_MAX_CHARS, bound_payload

    big = [_Int(10**299)] * 20  # 6,000 characters of JSON, a repr of 80
    got = bound_payload(big)
    assert isinstance(got, dict) and set(got) == {"summary"}
    controls = ["\x01" * 300] * 3  # \u0001 is six characters in JSON, \x01 four in the repr
    assert len(json.dumps(_reference_bound(controls), ensure_ascii=False)) > PAYLOAD_MAX_CHARS
    assert set(bound_payload(controls)) == {"summary"}  # type: ignore[arg-type]
    small = {"item": "item-00001", "n": _Int(3), "x": 1.5}
    assert bound_payload(small) == small and type(bound_payload(small)["n"]) is int  # type: ignore[index]


def test_recent_turns_are_the_newest_lines_across_a_rotation(tmp_path: Path) -> None:
    """The handoff's turns come from the tail of the two newest files: the newest ``limit`` lines, oldest first,
    without the torn last line or a corrupt line (what the full read skips too)."""
    live = LiveContext(BrainPaths(tmp_path), max_bytes=4096, keep=3)
    for i in range(40):
        live.append_turn(turn(text=f"turn {i:03d} " + "z" * 100, minutes=i))
    d = live.paths.live / "qa"
    assert (d / "log.1.jsonl").exists()
    with (d / "log.jsonl").open("a") as fh:
        fh.write("not json\n\n")
    with (d / "log.jsonl").open("a") as fh:
        fh.write('{"ts": "2026-03-18T10:0')  # torn: a crash mid-append
    two_newest = live.log_files("qa")[-2:]
    every = [t.text[:8] for t in live._read(two_newest)[0]]
    assert [t.text[:8] for t in live.recent_turns("qa", limit=1000)] == every
    newest = [t.text[:8] for t in live.recent_turns("qa", limit=12)]
    assert newest == every[-11:]  # 12 lines: the corrupt one and the 11 newest turns
    assert newest[-1] == "turn 039"
    assert live.recent_turns("nobody") == []


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
