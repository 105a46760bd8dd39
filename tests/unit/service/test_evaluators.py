"""The tick's evaluators tested alone, each given only the parts it uses: the stale-claims one (open claims past their
TTL become ``stale``, cheaply), the workflows one (a SIGHUP reloads everything)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ambient.claims.claim import new_claim
from ambient.claims.store import ClaimStore
from ambient.config.brain import load_brain
from ambient.engine.manager import RunManager
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState
from ambient.engine.tick import Tick
from ambient.service.adapters import BrainRef
from ambient.service.evaluators import (
    SeenWorkflows,
    StaleClaimsEvaluator,
    WorkflowEvaluator,
    WorkflowParts,
    _not_open,
)
from ambient.service.starts import RunStarts
from ambient.service.troubles import Troubles
from ambient.storage.journal import Journal
from ambient.storage.paths import BrainPaths
from ambient.storage.yamltext import dump_yaml

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class _Clock:
    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return 0.0


@pytest.fixture
def store(tmp_path: Path) -> ClaimStore:
    root = tmp_path / "brain"
    (root / "claims").mkdir(parents=True)
    return ClaimStore(BrainPaths(root), clock=_Clock())


def _count_calls(store: ClaimStore, name: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files ``store.<name>`` is called with, from now on."""
    calls: list[str] = []
    real = getattr(store, name)

    def counting(path: Path, *args: object) -> object:
        calls.append(path.name)
        return real(path, *args)

    monkeypatch.setattr(store, name, counting)
    return calls


async def test_claims_written_by_ambient_are_not_parsed_again(
    store: ClaimStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item claims ambient wrote are judged from memory; a claim a person wrote is parsed; both go stale."""
    for k in range(5):
        store.write_claim(new_claim(f"sess-item-{k}", "satellite", f"projects/x/{k}.md", "coder", NOW), durable=False)
    store.write_claim(
        new_claim("sess-old-item", "satellite", "projects/x/old.md", "coder", NOW - timedelta(days=3)), durable=False
    )
    by_hand = new_claim("sess-by-hand", "satellite", "projects/y.md", "person", NOW - timedelta(days=2))
    (store.dir / "sess-by-hand.yml").write_text(dump_yaml(by_hand.to_document()))

    reads = _count_calls(store, "read", monkeypatch)
    ev = StaleClaimsEvaluator(store, hours=24, clock=_Clock())
    assert ev._any_due(NOW) is True
    assert reads == ["sess-by-hand.yml"]  # the six claims the store wrote were not parsed
    reads.clear()
    assert ev._any_due(NOW) is True and reads == []  # nothing changed: nothing parsed

    await ev.evaluate(Tick(number=1, now=NOW))  # a timed tick marks them
    status = {c.sess_id: c.status for c in ClaimStore(store.paths, clock=_Clock()).list()}
    assert status["sess-old-item"] == "stale" and status["sess-by-hand"] == "stale"
    assert {status[f"sess-item-{k}"] for k in range(5)} == {"open"}
    reads.clear()
    assert ev._any_due(NOW) is False


async def test_file_events_alone_do_not_scan(store: ClaimStore) -> None:
    """Only timed ticks look at TTLs: a burst of file events costs nothing here."""
    store.write_claim(new_claim("sess-old", "satellite", "a.md", "coder", NOW - timedelta(days=3)), durable=False)
    ev = StaleClaimsEvaluator(store, hours=24, clock=_Clock())
    await ev.evaluate(Tick(number=1, now=NOW, changes=frozenset({store.dir / "sess-old.yml"})))
    assert store.get("sess-old").status == "open"
    await ev.evaluate(Tick(number=2, now=NOW))
    assert store.get("sess-old").status == "stale"


class _MovingClock:
    """NOW on the wall; a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.mono = 1000.0

    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return self.mono


async def test_runs_that_end_do_not_each_look_at_every_claim(
    store: ClaimStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's end asks for a timed tick; a look lists and stats all of claims/, which only grows. However many
    runs end, the claims are looked at once per ``every_s`` (the regular tick's period at most): a daemon's look per
    run no longer grows with every claim it ever wrote."""
    for k in range(30):
        closed = new_claim(f"sess-done-{k:02d}", "satellite", f"projects/d/{k}.md", "coder", NOW - timedelta(days=3))
        store.write_claim(closed.model_copy(update={"status": "closed"}), durable=False)
    clock = _MovingClock()
    ev = StaleClaimsEvaluator(store, hours=24, clock=clock)
    ev.every_s = 10.0
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path: object) -> object:
        listed.append(str(path))
        return real_scandir(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", scandir)
    for number in range(1, 6):  # five runs end within a few seconds: five timed ticks
        await ev.evaluate(Tick(number=number, now=NOW))
        clock.mono += 1.5
    assert listed.count(str(store.dir)) == 1
    store.write_claim(new_claim("sess-old", "satellite", "a.md", "coder", NOW - timedelta(days=3)), durable=False)
    clock.mono += 10.0  # the next look is due: the open claim past its TTL is found
    await ev.evaluate(Tick(number=6, now=NOW))
    assert store.get("sess-old").status == "stale"


def _past(ns: int) -> None:
    """Wait until the wall clock is 20 ms past ``ns`` (file ctimes come from a coarse clock, a few ms behind)."""
    deadline = time.monotonic() + 5
    while time.time_ns() < ns + 20_000_000:
        assert time.monotonic() < deadline


def test_closed_claims_are_not_remembered_and_changes_are_still_seen(
    store: ClaimStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-12: only open claims stay in memory (a soak writes 9 claim files per run); a closed claim a person
    reopens in place with its old mtime, or one moved in with an old mtime, is seen through its ctime; when the
    clock goes back, every file is looked at again."""
    for k in range(40):
        closed = new_claim(f"sess-closed-{k}", "satellite", f"projects/x/{k}.md", "coder", NOW - timedelta(days=3))
        store.write_claim(closed.model_copy(update={"status": "closed"}), durable=False)
    store.write_claim(new_claim("sess-open", "satellite", "projects/o.md", "coder", NOW), durable=False)
    by_hand = new_claim("sess-by-hand", "satellite", "projects/y.md", "person", NOW - timedelta(days=3))
    path = store.dir / "sess-by-hand.yml"
    path.write_text(dump_yaml(by_hand.model_copy(update={"status": "closed"}).to_document()))
    ev = StaleClaimsEvaluator(store, hours=24, clock=_Clock())
    ev.CTIME_SLACK_NS = 0  # exact here: the test waits out the coarse clock itself (_past)
    looks: list[int] = []

    def wall() -> int:
        looks.append(time.time_ns())
        return looks[-1]

    ev._wall_ns = wall
    reads = _count_calls(store, "read", monkeypatch)
    asked = _count_calls(store, "known_facts", monkeypatch)
    _past(max(p.stat().st_ctime_ns for p in store.dir.iterdir()))
    assert ev._any_due(NOW) is False
    # The closed claim written by hand is known closed from its status line: not parsed either.
    assert list(ev._open) == ["sess-open.yml"] and reads == [] and len(asked) == 42
    reads.clear()
    asked.clear()
    assert ev._any_due(NOW) is False  # nothing changed: no file parsed or even looked up, none remembered
    assert reads == [] and asked == []

    # A person reopens the closed claim in place and sets its mtime back: its ctime still moves.
    _past(looks[-1])
    st = path.stat()
    path.write_text(path.read_text().replace("status: closed", "status: open "))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ev._any_due(NOW) is True and reads == ["sess-by-hand.yml"]
    # A claim moved in from elsewhere with an old mtime: the rename sets its ctime.
    _past(looks[-1])
    outside = store.paths.root / "moved.yml"
    moved = new_claim("sess-moved", "satellite", "projects/m.md", "person", NOW - timedelta(days=3))
    outside.write_text(dump_yaml(moved.to_document()))
    os.utime(outside, ns=(0, 0))
    os.rename(outside, store.dir / "sess-moved.yml")
    reads.clear()
    assert ev._any_due(NOW) is True and reads == ["sess-moved.yml"]
    assert sorted(ev._open) == ["sess-by-hand.yml", "sess-moved.yml", "sess-open.yml"]
    # The clock goes back: a full look at every file not remembered as open (the 40 closed ones, known to the
    # store without parsing).
    asked.clear()
    ev._wall_ns = lambda: looks[-1] - 10**11
    ev._any_due(NOW)
    assert len(asked) == 40 and all(name.startswith("sess-closed-") for name in asked)


@pytest.mark.slow
def test_a_look_at_a_large_claims_folder_holds_one_entry_at_a_time(store: ClaimStore) -> None:
    """R-12: claims/ only grows, and a tick's look must not hold every entry at once. A list of 4,000 entries
    with their stats held 3.7 MB at each tick; freed again, such peaks left the allocator a little larger each
    time (the soak's RSS grew ~1 MB a minute). Now the peak does not depend on the folder's size."""
    import tracemalloc

    for k in range(4000):
        (store.dir / f"sess-20261101-0000-done-{k:05d}.yml").write_bytes(b"x")  # never parsed below
    ev = StaleClaimsEvaluator(store, hours=24, clock=_Clock())
    later = time.time_ns() + 60 * 10**9  # a look a minute after the last one: every file older than it
    ev._last_look_ns = ev._last_full_ns = later - 10**9
    ev._wall_ns = lambda: later
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert ev._any_due(NOW) is False
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 200_000, f"{peak} bytes at once for a look at 4,000 files"


def test_a_full_look_parses_no_closed_claim(store: ClaimStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running daemon's full look (every FULL_SCAN_S) parsed every claim file it had not written itself,
    2-3 ms each: minutes of CPU on a brain of many runs. A file whose one top-level status line is not ``open``
    is now passed over unparsed; anything unusual is parsed as before."""
    old = NOW - timedelta(days=3)
    for k in range(50):  # closed claims a previous daemon wrote: this store does not know them
        claim = new_claim(f"sess-done-{k:02d}", "satellite", f"projects/d/{k}.md", "coder", old)
        (store.dir / f"sess-done-{k:02d}.yml").write_text(
            dump_yaml(claim.model_copy(update={"status": "closed"}).to_document())
        )
    tricky = {
        # closed, with "status: open" inside an indented block scalar: still closed
        "sess-tricky-a.yml": dump_yaml(
            new_claim("sess-tricky-a", "satellite", "a.md", "p", old)
            .model_copy(update={"status": "closed"})
            .to_document()
        )
        + "notes: |\n  status: open\n",
        # open, quoted
        "sess-tricky-b.yml": dump_yaml(new_claim("sess-tricky-b", "satellite", "b.md", "p", old).to_document()).replace(
            "status: open", 'status: "open"'
        ),
        # open, in flow style: no status line at column 0, so parsed
        "sess-tricky-c.yml": "{sess_id: sess-tricky-c, type: satellite, scope: c.md, agent: p, status: open, "
        f'opened_at: "{old.strftime("%Y-%m-%dT%H:%M")}"}}\n',
    }
    for name, text in tricky.items():
        (store.dir / name).write_text(text)
    reads = _count_calls(store, "read", monkeypatch)
    ev = StaleClaimsEvaluator(store, hours=24, clock=_Clock())
    assert ev._any_due(NOW) is True
    assert sorted(reads) == ["sess-tricky-b.yml", "sess-tricky-c.yml"]  # the open ones only
    assert sorted(ev._open) == ["sess-tricky-b.yml", "sess-tricky-c.yml"]
    changed = store.mark_stale(now=NOW, default_ttl=timedelta(hours=24))
    assert sorted(changed) == ["sess-tricky-b", "sess-tricky-c"]


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        (b"sess_id: a\nstatus: closed\n", True),
        (b"status: 'stale' # by hand\r\n", True),
        (b"status: open\n", False),
        (b'status: "open"\n', False),
        (b"status: closed\nstatus: open\n", False),  # two: a duplicate key, the parser decides
        (b"{status: closed}\n", False),  # flow style: parsed
        (b"status:\n  closed\n", False),  # the value on the next line: parsed
        (b"status:closed\n", False),  # not a key in YAML: parsed (and refused)
        (b"  status: closed\n", False),  # indented: not a top-level key
        (b"x" * 300_000 + b"\nstatus: closed\n", False),  # over the size cap
    ],
)
def test_not_open_reads_only_what_is_certain(tmp_path: Path, text: bytes, closed: bool) -> None:
    path = tmp_path / "c.yml"
    path.write_bytes(text)
    assert _not_open(str(path)) is closed
    link = tmp_path / "link.yml"
    link.symlink_to(path)
    assert _not_open(str(link)) is False  # never follows a symlink


def _no_executor(state: RunState, journal: Journal) -> RunExecutor:
    raise AssertionError("no run starts in these tests")


async def test_a_sighup_reloads_everything_once_and_one_during_the_reload_again(tmp_path: Path) -> None:
    """The workflows evaluator owns the SIGHUP request: the next tick reloads with ``sighup`` (systemd is told, all is
    read again), once; a SIGHUP that comes while that reload runs is not lost in it: the tick after reloads again."""
    paths = BrainPaths(tmp_path / "brain")
    paths.state.mkdir(parents=True)
    ref = BrainRef(load_brain(paths, {}))
    manager = RunManager(paths, _no_executor, _Clock())
    seen = SeenWorkflows(paths.state / "workflows.json")
    starts = RunStarts(paths, ref, manager, _Clock(), lambda line: None, seen.mark_started)
    reloads: list[tuple[bool, bool]] = []
    evaluator: WorkflowEvaluator

    async def reload(*, only_workflows: bool = False, sighup: bool = False) -> None:
        reloads.append((only_workflows, sighup))
        if len(reloads) == 1:
            evaluator.request_reload()  # SIGHUP again, while the first reload runs

    parts = WorkflowParts(
        paths, ref, manager, starts, Troubles(paths, _Clock()), seen, wake=lambda: None, reload=reload
    )
    evaluator = WorkflowEvaluator(parts)
    await evaluator.evaluate(Tick(1, NOW))
    assert reloads == []  # nothing changed, nothing asked
    evaluator.request_reload()
    await evaluator.evaluate(Tick(2, NOW))
    assert reloads == [(False, True)]
    await evaluator.evaluate(Tick(3, NOW))
    assert reloads == [(False, True), (False, True)]
    await evaluator.evaluate(Tick(4, NOW))
    assert reloads == [(False, True), (False, True)]
