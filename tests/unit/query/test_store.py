"""The query store (``ambient.query``): rebuilt when missing, torn or of another version, refreshed incrementally
from the files, bad files as problem rows, the same answers as the files' own readers."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from ambient.claims.index import census
from ambient.claims.store import ClaimStore
from ambient.core.clock import utcnow
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.query import views
from ambient.query.schema import FORMAT
from ambient.query.store import DB_NAME, QueryStore
from ambient.storage.paths import BrainPaths

T0 = "2026-11-30T10:00:00.000+00:00"


def _claim(sid: str, status: str = "open", extra: str = "") -> str:
    return (
        f"sess_id: {sid}\ntype: satellite\nscope: projects/{sid}.md\nagent: worker\nstatus: {status}\n"
        f'opened_at: "2026-11-30T10:00"\n{extra}'
    )


def _journal(run_id: str, items: list[str], *, finished: bool, done: int | None = None) -> str:
    lines: list[dict[str, object]] = [
        {"ev": "started", "run_id": run_id, "workflow": "wf", "form": "for_each", "spec_hash": None, "spec": {},
         "items": items, "mode": None, "trigger": "file", "context": {}, "at": T0},
    ]  # fmt: skip
    for n, name in enumerate(items[: len(items) if done is None else done]):
        lines.append({"ev": "accepted", "item": name, "attempt": 1, "key": f"{run_id}/{name}/1", "at": f"A{n}"})
        lines.append(
            {"ev": "finished", "item": name, "attempt": 1, "agent": "w", "result": "success", "duration_ms": 5,
             "at": f"F{n}"}
        )  # fmt: skip
    if finished:
        lines.append({"ev": "finished_run", "outcome": "success", "at": "END"})
    return "".join(json.dumps(line) + "\n" for line in lines)


def _record(run_id: str, workflow: str = "wf") -> str:
    return json.dumps(
        {"kind": "run", "run_id": run_id, "workflow": workflow, "started_at": T0, "completed_at": T0,
         "outcome": "success", "steps": [], "escalations": 1, "errors": 0}
    ) + "\n"  # fmt: skip


def _write(path: Path, text: str) -> None:
    """As ambient writes: a new file renamed over the old one (the folder's mtime changes)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    paths = BrainPaths(root)
    for d in (paths.claims, paths.run_journals, paths.escalations):
        d.mkdir(parents=True)
    paths.state.chmod(0o700)
    _write(paths.claims / "sess-a.yml", _claim("sess-a"))
    _write(paths.claims / "sess-b.yml", _claim("sess-b", "closed"))
    _write(paths.claims / "sess-c.yml", _claim("sess-c", "waiting_human", "ttl: 2h\n"))
    _write(paths.claims / "sess-a-copy.yml", _claim("sess-a"))  # a second file of sess-a: a problem
    _write(paths.claims / "broken.yml", "sess_id: [unclosed\n")
    _write(paths.run_journals / "run-1.jsonl", _journal("run-1", ["a", "b", "c"], finished=False, done=1))
    _write(paths.run_journals / "run-0.jsonl", _journal("run-0", ["a"], finished=True))
    _write(paths.runs_log, _record("run-0"))
    store = EscalationStore(paths)
    store.create(
        new_escalation(
            EscalationDraft(workflow="wf", run_id="run-1", kind="fail", question="why?", item="b"), now=utcnow()
        )
    )
    return paths


def _answers(paths: BrainPaths) -> dict[str, object]:
    """Everything the views say, as plain data."""
    store = QueryStore.fresh(paths)
    try:
        with store.reading() as conn:
            counts = views.claim_counts(conn)
            return {
                "running": [(r.run_id, r.done, r.total, [(i.name, i.status) for i in r.items])
                            for r in views.runs_in_progress(conn)],
                "finished": [(r.run_id, r.outcome) for r in views.finished_runs(conn)],
                "records": views.records(conn),
                "lines": views.record_lines(conn),
                "escalations": [(e.id, e.status, e.question) for e in views.escalations(conn)],
                "esc_problems": [str(p) for p in views.escalation_problems(conn)],
                "claims": counts.by_status,
                "claim_problems": [str(p) for p in counts.problems],
            }  # fmt: skip
    finally:
        store.close()


def test_views_answer_as_the_files_own_readers(brain: BrainPaths) -> None:
    """Claims as the claims census counts them, escalations as their store lists them, runs as their journals fold."""
    got = _answers(brain)
    seen = census(ClaimStore(brain, check_filesystem=False), save=False)
    assert got["claims"] == {"open": seen.count("open"), "closed": 1, "waiting_human": 1}
    assert got["claim_problems"] == [str(p) for p in seen.problems]
    assert any("already used by claims/sess-a-copy.yml" in p or "sess-a" in p for p in got["claim_problems"])
    assert [(e.id, e.status, e.question) for e in EscalationStore(brain).list()] == got["escalations"]
    assert got["running"] == [("run-1", 1, 3, [("a", "done"), ("b", "pending"), ("c", "pending")])]
    assert got["finished"] == [("run-0", "success")]
    assert [r["run_id"] for r in got["records"]] == ["run-0"]  # type: ignore[index]


def test_item_times_come_from_the_journal(brain: BrainPaths) -> None:
    """An item's first start and end are the ``at`` of its first ``accepted`` and last ``finished``."""
    store = QueryStore.fresh(brain)
    with store.reading() as conn:
        run = views.run(conn, "run-1")
    store.close()
    assert run is not None
    assert [(i.first_start, i.ended_at) for i in run.items] == [("A0", "F0"), (None, None), (None, None)]


@pytest.mark.parametrize(
    "damage",
    ["missing", "garbage", "other_format", "other_code"],
)
def test_a_store_that_cannot_be_trusted_is_rebuilt_with_the_same_answers(brain: BrainPaths, damage: str) -> None:
    """Missing, torn (not a database), of another format version or written by other code: rebuilt from the files."""
    before = _answers(brain)
    db = brain.state / DB_NAME
    if damage == "missing":
        db.unlink()
    elif damage == "garbage":
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        db.write_bytes(b"this is not a database" * 100)
    else:
        conn = sqlite3.connect(db)
        if damage == "other_format":
            conn.execute(f"PRAGMA user_version={FORMAT + 1}")
        else:
            conn.execute("UPDATE meta SET value='someone-else' WHERE key='code'")
        conn.commit()
        conn.close()
    assert _answers(brain) == before
    assert db.exists() and (db.stat().st_mode & 0o777) == 0o600


def test_refresh_reads_only_what_changed_and_says_which_topics(brain: BrainPaths) -> None:
    """A new claim, a rewritten escalation, an appended journal event, runs.jsonl growing, a deleted file."""
    store = QueryStore(brain)
    store.refresh()
    assert store.refresh() == set()  # nothing changed: nothing read

    _write(brain.claims / "sess-new.yml", _claim("sess-new"))
    assert store.refresh() == {"claims"}
    (esc,) = EscalationStore(brain).list()
    EscalationStore(brain).answer(esc.id, "retry", by="me", channel="cli")
    assert store.refresh() == {"escalations"}
    with (brain.run_journals / "run-1.jsonl").open("a") as fh:
        fh.write(json.dumps({"ev": "accepted", "item": "b", "attempt": 1, "at": "A1"}) + "\n")
    assert store.refresh() == {"runs", "run:run-1"}
    with brain.runs_log.open("a") as fh:
        fh.write(_record("run-9") + "not json\n" + '{"torn')
    assert store.refresh() == {"records"}
    (brain.claims / "sess-b.yml").unlink()
    (brain.run_journals / "run-0.jsonl").unlink()
    assert store.refresh() == {"claims", "runs", "run:run-0"}

    with store.reading() as conn:
        assert views.claim_counts(conn).count("open") == 2  # sess-a, sess-new
        assert views.claim_counts(conn).count("closed") == 0
        assert views.escalations(conn, status="pending") == []
        assert views.escalations(conn, answered=True)[0].decision == "retry"
        (run,) = views.runs_in_progress(conn)
        assert [(i.name, i.status, i.first_start) for i in run.items][1] == ("b", "running", "A1")
        assert views.finished_runs(conn) == []
        lines = views.record_lines(conn)
        assert (len(lines.lines), lines.bad_lines, lines.torn_tail) == (2, [3], True)
    store.close()


def test_a_claim_in_use_edited_in_place_is_seen(brain: BrainPaths) -> None:
    """A person's editor writing in place (same inode, no folder change): a claim not closed is looked at anyway."""
    store = QueryStore(brain)
    store.refresh()
    path = brain.claims / "sess-c.yml"
    with path.open("r+") as fh:
        fh.write(_claim("sess-c", "closed       ", "ttl: 2h\n"))
    assert store.refresh() == {"claims"}
    with store.reading() as conn:
        assert views.claim_counts(conn).count("waiting_human") == 0
    store.close()


def test_a_pending_escalation_answered_under_its_first_inode_is_seen(brain: BrainPaths) -> None:
    """Answered and rewritten twice between two refreshes, an escalation file may get its first inode back (ext4):
    a pending one is looked at by (inode, size, mtime) anyway. (A rule's answer stayed "pending" in `ambient
    escalations`: tests/acceptance/test_learning.py's rule tests failed on it.) Here the answer is written in place:
    the same inode, no change of the folder."""
    escalations = EscalationStore(brain)
    esc = escalations.create(
        new_escalation(
            EscalationDraft(
                workflow="wf",
                run_id="run-q",
                kind="fail",
                question="retry?",
                item="a",
                options=[("retry", "Retry", "retry"), ("skip", "Skip", "skip")],
            ),
            now=utcnow(),
        )
    )
    path = brain.escalations / f"{esc.id}.yml"
    pending = path.read_bytes()
    escalations.answer(esc.id, "skip", by="rule", channel="cli")
    answered = path.read_bytes()
    with path.open("r+b") as fh:  # pending again, under the answered file's inode
        fh.write(pending)
        fh.truncate()
    store = QueryStore(brain)
    store.refresh()
    with store.reading() as conn:
        assert esc.id in [e.id for e in views.escalations(conn, status="pending")]
    with path.open("r+b") as fh:  # answered, in place: the listing's (name, inode) pairs are the same
        fh.write(answered)
        fh.truncate()
    assert "escalations" in store.refresh()
    with store.reading() as conn:
        assert esc.id not in [e.id for e in views.escalations(conn, status="pending")]
        [row] = [e for e in views.escalations(conn) if e.id == esc.id]
        assert (row.status, row.decision) == ("answered", "skip")
    store.close()


def test_bad_files_are_problem_rows_never_exceptions(brain: BrainPaths) -> None:
    """An escalation file that does not parse, a journal that does not fold, a claim that is not one: shown."""
    (brain.escalations / "esc-zzzzzz.yml").write_text("id: [bad\n")
    (brain.escalations / "notes.yml").write_text("x: 1\n")
    (brain.run_journals / "run-2.jsonl").write_text('{"ev": "accepted", "item": "a"}\n')
    got = _answers(brain)
    assert [p.split(":")[0] for p in got["esc_problems"]] == [  # type: ignore[union-attr]
        ".ambient/escalations/esc-zzzzzz.yml",
        ".ambient/escalations/notes.yml",
    ]
    store = QueryStore.fresh(brain)
    with store.reading() as conn:
        (problem,) = views.unreadable_runs(conn)
    store.close()
    assert problem.startswith(".ambient/runs/run-2.jsonl:1: run journal does not load")
    assert any(p.startswith("claims/broken.yml") for p in got["claim_problems"])  # type: ignore[union-attr]


def test_a_store_that_cannot_be_written_is_kept_in_memory(brain: BrainPaths) -> None:
    """A read-only .ambient/: the readers still answer (from a store in memory)."""
    if os.geteuid() == 0:
        db = brain.state / DB_NAME
        db.mkdir()  # root writes anywhere: a folder where the database should be cannot be opened
    else:
        brain.state.chmod(0o500)
    try:
        got = _answers(brain)
    finally:
        brain.state.chmod(0o700)
    assert got["running"] and got["claims"]


def _many_claims(paths: BrainPaths, count: int) -> None:
    for n in range(count):
        _write(
            paths.claims / f"sess-many-{n:04d}.yml", _claim(f"sess-many-{n:04d}", "open" if n % 50 == 0 else "closed")
        )


def test_claims_are_built_by_one_process_at_a_time(brain: BrainPaths) -> None:
    """While another process holds the build lock, a refresh fills everything but the claims and says they are not
    indexed (no second build); once the lock is free, a refresh builds them, with the answers of a build at once."""
    from ambient.query import builder
    from ambient.query.store import BUILD_LOCK

    _many_claims(brain, 300)
    expected = _answers(brain)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{brain.state / DB_NAME}{suffix}").unlink(missing_ok=True)
    holder = os.open(brain.state / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    import fcntl

    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        store = QueryStore.fresh(brain)
        try:
            assert not store.claims_indexed() and store.building()
            with store.reading() as conn:
                assert [r.run_id for r in views.runs_in_progress(conn)] == ["run-1"]
        finally:
            store.close()
        assert QueryStore.readiness(brain) == "claims"
        assert builder.start(brain) is False  # one holds the lock: none started
    finally:
        os.close(holder)
    assert _answers(brain) == expected
    assert QueryStore.readiness(brain) == "ready"


def test_a_build_stopped_half_way_goes_on_where_it_was(brain: BrainPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims of a build are committed slice by slice: a builder killed after some slices leaves them, and the
    next refresh reads only the rest, to the answers of a build in one go."""
    from ambient.query import store as store_mod

    _many_claims(brain, 300)
    expected = _answers(brain)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{brain.state / DB_NAME}{suffix}").unlink(missing_ok=True)
    monkeypatch.setattr(store_mod, "_BUILD_SLICE_S", 0.0)  # one file per slice
    monkeypatch.setattr(store_mod, "_BUILD_PAUSE_S", 0.0)
    real = QueryStore._claims_slice
    slices: list[int] = []

    def killed_after_ten(self: QueryStore, *args: object) -> list[str]:
        if len(slices) == 10:
            raise KeyboardInterrupt  # the builder stopped mid-way
        slices.append(1)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(QueryStore, "_claims_slice", killed_after_ten)
    store = QueryStore(brain)
    with pytest.raises(KeyboardInterrupt):
        store.refresh()
    store.close()
    partial = QueryStore(brain)
    try:
        assert not partial.claims_indexed() and partial.claim_files_indexed() == 10
    finally:
        partial.close()
    monkeypatch.setattr(QueryStore, "_claims_slice", real)
    read: list[str] = []
    monkeypatch.setattr(
        QueryStore, "_claims_slice", lambda self, conn, todo, seed: read.append(todo[0]) or real(self, conn, todo, seed)
    )
    assert _answers(brain) == expected
    assert len(read) == 305 - 10  # the files read before were not read again


def test_a_store_whose_first_refresh_was_stopped_is_filled_by_the_next(
    brain: BrainPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A builder stopped while it read the runs leaves a store of this code but not filled: readers are told it is
    missing (status then looks at the files itself), and the next refresh fills it, to the same answers."""
    expected = _answers(brain)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{brain.state / DB_NAME}{suffix}").unlink(missing_ok=True)
    real = QueryStore._journals

    def stopped(self: QueryStore, *args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(QueryStore, "_journals", stopped)
    store = QueryStore(brain)
    with pytest.raises(KeyboardInterrupt):
        store.refresh()
    store.close()
    assert (brain.state / DB_NAME).exists() and QueryStore.readiness(brain) == "missing"
    monkeypatch.setattr(QueryStore, "_journals", real)
    assert _answers(brain) == expected
    assert QueryStore.readiness(brain) == "ready"
