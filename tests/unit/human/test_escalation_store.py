"""The escalation files: persisted before notification, deduplicated, answered exactly once (also by two processes at
once), deadlines kept on disk, malformed files kept; the CLI that lists and answers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.core.errors import AlreadyAnsweredError, InputError, InvalidOptionError, UnknownEscalationError
from ambient.human import escalations as esc_mod
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import (
    Escalation,
    EscalationDraft,
    find_pending,
    new_escalation,
    next_timer,
    reminder_due,
    timeout_due,
)
from ambient.storage.paths import BrainPaths
from tests.unit.human.test_escalations import T0, _fail


@pytest.fixture
def brain(tmp_path: Path) -> Path:
    """An empty brain root (its agents/ folder is what makes the CLI take it for a brain), with the journal of the
    unfinished run ``run-1`` the escalations here belong to (an answer to a run that ended is not taken)."""
    root = tmp_path / "brain"
    (root / "agents").mkdir(parents=True)
    _journal(BrainPaths(root), "run-1")
    return root


def _journal(paths: BrainPaths, run_id: str, *, outcome: str | None = None) -> None:
    """A run's journal: started, and finished with ``outcome`` when given."""
    paths.run_journals.mkdir(parents=True, exist_ok=True)
    records = [{"ev": "started", "run_id": run_id, "workflow": "deploy-batch", "form": "for_each", "items": ["a"]}]
    if outcome is not None:
        records.append({"ev": "finished_run", "outcome": outcome, "at": "2026-01-01T00:00:00+00:00"})
    paths.run_journal(run_id).write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def store(brain: Path) -> EscalationStore:
    """A store on the empty brain."""
    return EscalationStore(BrainPaths(brain))


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


class TestCreate:
    def test_file_is_durable_before_notify(self, store: EscalationStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """create() returns only after file fsync, rename and directory fsync; notifying comes after."""
        events: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            real_fsync(fd)
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

        def replace(src: Any, dst: Any) -> None:
            real_replace(src, dst)
            events.append(("replace", str(dst)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        created = store.create(_fail())
        events.append(("notify", created.id))  # what the daemon does next
        target = str(store.path_for(created.id))
        i_replace = events.index(("replace", target))
        assert events[i_replace - 1][0] == "fsync" and ".tmp." in events[i_replace - 1][1]  # file content
        assert events[i_replace + 1] == ("fsync", str(store.dir))  # directory entry
        assert events[-1] == ("notify", created.id)
        again = EscalationStore(store.paths).get(created.id)  # a fresh reader sees it whole
        assert again == created

    def test_file_is_private_and_readable(self, store: EscalationStore) -> None:
        """The file is 0600 (it holds the button nonce) and starts with how to answer."""
        created = store.create(_fail())
        path = store.path_for(created.id)
        assert path.stat().st_mode & 0o777 == 0o600
        text = path.read_text()
        assert text.startswith(f"# ambient escalation (pending). Answer with: ambient decide {created.id}")
        assert "decision:" not in text  # unanswered fields are left out while empty

    def test_same_situation_is_not_escalated_twice(self, store: EscalationStore) -> None:
        """A second escalation with the same dedupe key returns the pending one; nothing new is written."""
        first = store.create(_fail())
        second = store.create(_fail(now=T0 + timedelta(minutes=5)))
        assert second.id == first.id
        assert len(list(store.dir.glob("*.yml"))) == 1
        other = store.create(_fail("instance-04"))
        assert other.id != first.id
        store.answer(first.id, "retry", by="me", channel="cli", now=T0 + timedelta(minutes=6))
        third = store.create(_fail(now=T0 + timedelta(minutes=7)))  # it failed again after the retry
        assert third.id != first.id
        assert find_pending(store.list(), first.dedupe_key) == third


class TestRefusedAnswersChangeNothing:
    def test_store_refusals_leave_bytes_identical(self, store: EscalationStore) -> None:
        """Unknown option, unknown id and a second answer leave every file byte for byte as it was."""
        a = store.create(_fail())
        b = store.create(_fail("instance-04"))
        store.answer(b.id, "abort", by="me", channel="cli", now=T0)
        before = _snapshot(store.dir)
        with pytest.raises(InvalidOptionError):
            store.answer(a.id, "9", by="me", channel="cli")
        with pytest.raises(AlreadyAnsweredError):
            store.answer(b.id, "retry", by="me", channel="telegram")
        with pytest.raises(UnknownEscalationError):
            store.answer("esc-aaaaaa", "retry", by="me", channel="cli")
        with pytest.raises(InputError):
            store.answer(a.id, "retry", by="me", channel="cli", note="x" * 5000)
        assert _snapshot(store.dir) == before

    def test_cli_refusals_exit_codes(self, store: EscalationStore, capsys: pytest.CaptureFixture[str]) -> None:
        """decide: option not offered or unknown id → 2, already answered → 1; nothing changes."""
        a = store.create(_fail())
        root = str(store.paths.root)
        assert main(["decide", "--brain", root, a.id, "2"]) == 0
        before = _snapshot(store.dir)
        capsys.readouterr()
        assert main(["decide", "--brain", root, a.id, "retry"]) == 1
        assert "already answered: skip" in capsys.readouterr().err
        b = store.create(_fail("instance-09"))
        before = _snapshot(store.dir)
        assert main(["decide", "--brain", root, b.id, "approve"]) == 2
        assert "does not offer 'approve'" in capsys.readouterr().err
        assert main(["decide", "--brain", root, "esc-zzzzzz", "1"]) == 2
        assert "no escalation 'esc-zzzzzz'" in capsys.readouterr().err
        assert main(["decide", "--brain", root, "../x", "1"]) == 2
        assert _snapshot(store.dir) == before


_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ambient.human.escalation_store import EscalationStore
    from ambient.core.errors import AlreadyAnsweredError
    from ambient.storage.paths import BrainPaths

    store = EscalationStore(BrainPaths(Path(sys.argv[1])))
    who, option = sys.argv[2], sys.argv[3]
    print("ready", flush=True)
    for line in sys.stdin:
        esc_id, start = line.split()
        while time.monotonic() < float(start):  # both processes start at the same instant
            pass
        try:
            store.answer(esc_id, option, by=who, channel="cli")
            print("won", flush=True)
        except AlreadyAnsweredError:
            print("lost", flush=True)
    """
)


@pytest.mark.slow
def test_two_processes_answering_at_once_exactly_one_wins(store: EscalationStore) -> None:
    """Two real processes answer the same escalations at the same instant: exactly one wins each time."""
    rounds = 15
    ids = [store.create(_fail(f"item-{i}")).id for i in range(rounds)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(store.paths.root), who, option],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who, option in (("cli-user", "retry"), ("telegram-user", "skip"))
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        winners = []
        for esc_id in ids:
            start = time.monotonic() + 0.03
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{esc_id} {start}\n")
                p.stdin.flush()
            outcome = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
            assert sorted(outcome) == ["lost", "won"], outcome
            winner = ("cli-user", "telegram-user")[outcome.index("won")]
            stored = store.get(esc_id)
            assert stored.by == winner and stored.decision == {"cli-user": "retry", "telegram-user": "skip"}[winner]
            winners.append(winner)
    finally:
        for p in procs:
            assert p.stdin is not None and p.stdout is not None and p.stderr is not None
            p.stdin.close()  # end of input: the worker's loop ends and it exits
            p.wait(timeout=20)
            p.stdout.close()
        errors = []
        for p in procs:
            assert p.stderr is not None
            errors.append(p.stderr.read())
            p.stderr.close()
    assert [p.returncode for p in procs] == [0, 0], errors
    assert all(s.status == "answered" for s in store.list())


class TestDeadlines:
    def test_deadline_and_reminder_survive_a_reload(self, store: EscalationStore) -> None:
        """Deadline and reminder are absolute on disk: a new store (restart) sees the same instants."""
        created = store.create(
            _fail(timeout=timedelta(hours=1), on_timeout="reject", remind_before=timedelta(minutes=10))
        )
        text = store.path_for(created.id).read_text()
        assert "deadline: '2026-03-16T21:36:00Z'" in text and "remind_at: '2026-03-16T21:26:00Z'" in text
        restarted = EscalationStore(BrainPaths(store.paths.root))
        escs = restarted.list()
        assert escs[0].deadline == T0 + timedelta(hours=1)
        assert not reminder_due(escs[0], T0 + timedelta(minutes=49))
        assert reminder_due(escs[0], T0 + timedelta(minutes=50))
        assert not timeout_due(escs[0], T0 + timedelta(minutes=59))
        assert timeout_due(escs[0], T0 + timedelta(hours=1))
        assert not reminder_due(escs[0], T0 + timedelta(hours=1))  # the deadline wins: no reminder once it is due
        assert next_timer(escs) == T0 + timedelta(minutes=50)  # the reminder fires first, then the deadline
        reminded = restarted.mark_reminded(created.id, now=T0 + timedelta(minutes=50))
        [again] = restarted.list()
        assert reminded.reminded and not reminder_due(again, T0 + timedelta(minutes=55))
        assert again.notify.delivered_at is None and again.notify.next_at == T0 + timedelta(minutes=50)  # goes out
        expired = restarted.apply_timeout(created.id, now=T0 + timedelta(hours=1))
        assert expired is not None
        assert (expired.status, expired.decision, expired.channel, expired.by) == (
            "expired",
            "abort",
            "timeout",
            "timeout",
        )
        assert expired.decided_action == "abort" and expired.latency_s == 3600.0
        with pytest.raises(AlreadyAnsweredError, match="decided: abort by timeout"):
            restarted.answer(created.id, "retry", by="me", channel="cli")

    def test_answer_beats_timeout(self, store: EscalationStore) -> None:
        """Once answered, a due timeout does nothing and writes nothing."""
        created = store.create(_fail(timeout=timedelta(minutes=1), on_timeout="reject"))
        store.answer(created.id, "retry", by="me", channel="cli", now=T0 + timedelta(seconds=30))
        before = _snapshot(store.dir)
        assert store.apply_timeout(created.id, now=T0 + timedelta(hours=1)) is None
        assert _snapshot(store.dir) == before


class TestStoreFiles:
    @pytest.mark.slow
    def test_notification_attempts_are_recorded(self, store: EscalationStore) -> None:
        """Failed attempts keep the retry time and error; success sets delivered_at; the list is capped."""
        created = store.create(_fail())
        for i in range(25):
            store.record_attempt(
                created.id, False, "HTTP 500", T0 + timedelta(seconds=i + 1), now=T0 + timedelta(seconds=i)
            )
        e = store.get(created.id)
        assert e.notify.count == 25 and len(e.notify.attempts) == esc_mod.MAX_ATTEMPTS_KEPT
        assert e.notify.next_at == T0 + timedelta(seconds=25) and e.notify.delivered_at is None
        e = store.record_attempt(created.id, True, now=T0 + timedelta(minutes=1), refs={"telegram": "42"})
        assert e.notify.delivered_at == T0 + timedelta(minutes=1) and e.notify.next_at is None
        assert e.notify.refs == {"telegram": "42"} and e.status == "pending"

    def test_user_keys_survive_a_rewrite(self, store: EscalationStore) -> None:
        """Keys a person added by hand are kept when ambient rewrites the file."""
        created = store.create(_fail())
        path = store.path_for(created.id)
        path.write_text(path.read_text() + "my_comment: check the logs first\n")
        store.answer(created.id, "skip", by="me", channel="cli")
        assert "my_comment: check the logs first" in path.read_text()

    def test_malformed_files_are_reported_and_kept(self, store: EscalationStore) -> None:
        """Broken files become problems with file and line, are skipped, and are never deleted."""
        good = store.create(_fail())
        store.dir.joinpath("esc-broken.yml").write_text("id: esc-broken\nkind: [unclosed\n")
        store.dir.joinpath("esc-wrongid.yml").write_text(store.path_for(good.id).read_text())
        store.dir.joinpath("esc-invalid.yml").write_text(
            store.path_for(good.id).read_text().replace(good.id, "esc-invalid").replace("kind: fail", "kind: oops")
        )
        store.dir.joinpath("notes.txt").write_text("not an escalation")
        before = _snapshot(store.dir)
        scan = store.scan()
        assert [e.id for e in scan.escalations] == [good.id]
        msgs = {Path(p.file).name: str(p) for p in scan.problems}
        assert set(msgs) == {"esc-broken.yml", "esc-wrongid.yml", "esc-invalid.yml"}
        assert "the file must be named" in msgs["esc-wrongid.yml"]
        assert "esc-invalid.yml:7: is not a valid escalation: kind" in msgs["esc-invalid.yml"]
        with pytest.raises(InputError, match=r"esc-broken\.yml:\d+: .*expected valid YAML"):
            store.answer("esc-broken", "retry", by="me", channel="cli")
        assert store.create(_fail()).id == good.id  # dedupe still works around broken files
        assert _snapshot(store.dir) == before

    def test_cancel(self, store: EscalationStore) -> None:
        """A cancelled escalation refuses answers."""
        created = store.create(_fail())
        store.cancel(created.id, "run aborted", now=T0)
        with pytest.raises(AlreadyAnsweredError, match="cancelled"):
            store.answer(created.id, "retry", by="me", channel="telegram")


class TestCli:
    def test_list_pending(self, store: EscalationStore, capsys: pytest.CaptureFixture[str]) -> None:
        """`ambient escalations` shows id, where, question, numbered options, deadline and how to answer."""
        a = store.create(_fail(timeout=timedelta(days=3650), on_timeout="reject"))
        b = store.create(
            new_escalation(
                EscalationDraft(workflow="w", run_id="r", kind="gate", question="Ship?", step="release"), now=T0
            )
        )
        store.answer(b.id, "approve", by="me", channel="cli")
        assert main(["escalations", "--brain", str(store.paths.root)]) == 0
        text = capsys.readouterr().out
        assert f"{a.id}  deploy-batch / instance-03  (fail, agent deploy," in text
        assert "Item instance-03 failed: exit code 1" in text
        assert "1) retry  Run it again" in text and "3) abort  Abort the run" in text
        assert "deadline: 2036-03-13T20:36:00+00:00" in text and "then reject" in text
        assert f"answer: ambient --brain {store.paths.root} decide {a.id}" in text
        assert b.id not in text
        assert main(["escalations", "--all", "--brain", str(store.paths.root)]) == 0
        assert "answered: approve by me via cli" in capsys.readouterr().out

    def test_list_json_and_empty(self, store: EscalationStore, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints the stored fields; an empty brain says there is nothing pending."""
        root = str(store.paths.root)
        assert main(["escalations", "--brain", root]) == 0
        assert capsys.readouterr().out.strip() == "No pending escalations."
        a = store.create(_fail())
        assert main(["escalations", "--json", "--brain", root]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [d["id"] for d in data] == [a.id] and data[0]["options"][0]["key"] == "retry"

    def test_decide(
        self, store: EscalationStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`ambient decide ID N --note` records the option, $USER, channel cli and the note."""
        monkeypatch.setenv("USER", "alice")
        a = store.create(_fail())
        assert main(["decide", "--brain", str(store.paths.root), a.id[4:], "1", "--note", "flaky network"]) == 0
        assert f"{a.id}: retry (Run it again), decided by alice via cli" in capsys.readouterr().out
        done = store.get(a.id)
        assert (done.decision, done.by, done.channel, done.note) == ("retry", "alice", "cli", "flaky network")

    def test_decide_without_user(
        self, store: EscalationStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without $USER the decision is recorded as by 'human'."""
        monkeypatch.delenv("USER", raising=False)
        a = store.create(_fail())
        assert main(["decide", "--brain", str(store.paths.root), a.id, "abort"]) == 0
        assert store.get(a.id).by == "human"


@pytest.mark.slow
def test_listing_parses_only_changed_files(store: EscalationStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon lists every escalation at each tick, decided ones included (they stay for good): a file is
    parsed again only when it changed, and callers get copies of what was read."""
    made = [store.create(_fail(f"instance-{k:02d}", now=T0 + timedelta(seconds=k))) for k in range(20)]
    store = EscalationStore(store.paths)  # a new store (a daemon started again): nothing read yet
    reads: list[str] = []
    real = store._read

    def counting(path: Path) -> Escalation:
        reads.append(path.name)
        return real(path)

    monkeypatch.setattr(store, "_read", counting)
    first = store.list()
    assert [e.id for e in first] == [e.id for e in made] and len(reads) == 20
    reads.clear()
    first[0].options.clear()  # a caller changing what it got changes nothing for the next one
    again = store.list()
    assert reads == [] and again == [store.get(e.id) for e in made] and again[0].options
    store.answer(made[3].id, "retry", by="human", channel="cli", now=T0 + timedelta(minutes=5))
    path = store.path_for(made[7].id)
    path.write_text(path.read_text().replace("Item instance-07 failed", "Item instance-07 failed badly"))
    reads.clear()
    listed = {e.id: e for e in store.list(status="pending")}
    assert sorted(reads) == sorted([f"{made[3].id}.yml", f"{made[7].id}.yml"])
    assert made[3].id not in listed and "badly" in listed[made[7].id].question
    path.unlink()
    reads.clear()
    assert len(store.list()) == 19 and reads == []


class TestAnswersNothingWouldApply:
    """An answer to a question whose run ended is said (exit 3) and closes the question with the reason; an answer
    that cannot be written says so (exit 4): ``decide`` exits 0 only once the answer is where the daemon applies it."""

    def test_an_answer_after_the_run_ended_exits_3_and_closes_the_question(
        self, store: EscalationStore, capsys: pytest.CaptureFixture[str]
    ) -> None:
        esc = store.create(_fail().model_copy(update={"run_id": "run-2"}))
        _journal(store.paths, "run-2", outcome="partial")
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "retry"]) == 3
        err = capsys.readouterr().err
        assert "was not applied" in err and "partial" in err
        after = store.get(esc.id)
        assert after.status == "cancelled" and after.decision is None
        assert after.note is not None and "retry" in after.note and "partial" in after.note

    def test_an_option_not_offered_is_refused_before_the_run_is_looked_at(self, store: EscalationStore) -> None:
        esc = store.create(_fail().model_copy(update={"run_id": "run-2"}))
        _journal(store.paths, "run-2", outcome="partial")
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "nonsense"]) == 2
        assert store.get(esc.id).status == "pending"

    def test_an_answer_that_cannot_be_written_exits_4_not_1(
        self, store: EscalationStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        esc = store.create(_fail())

        def full(*_: Any, **__: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("ambient.human.escalation_store.atomic_write", full)
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "retry"]) == 4
        assert "could not be written" in capsys.readouterr().err
        assert store.get(esc.id).status == "pending"

    def test_an_already_answered_question_still_exits_1(self, store: EscalationStore) -> None:
        esc = store.create(_fail())
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "retry"]) == 0
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "skip"]) == 1

    def test_a_crash_while_answering_exits_4_not_1(
        self, store: EscalationStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        esc = store.create(_fail())

        def broken(*_: Any, **__: Any) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr("ambient.human.escalation_store.atomic_write", broken)
        assert main(["decide", "--brain", str(store.paths.root), esc.id, "retry"]) == 4
        assert "nothing was decided" in capsys.readouterr().err
