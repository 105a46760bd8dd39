"""The retry outbox through apprise's real code against a local HTTP server: on disk before any send, retried with
backoff across a restart, delivered once, escalations never dropped (R-10, S-06)."""

from __future__ import annotations

import asyncio
import io
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.core.clock import SystemClock
from ambient.core.redact import SecretRegistry
from ambient.human.messages import Message
from ambient.human.notify import AppriseNotifier, SendReport
from ambient.human.outbox import Outbox, RetryPolicy, drain, next_attempt_at, run_outbox
from tests.conftest import async_wait_until, debug_log_buffer
from tests.unit.human.conftest import TOKEN, FakeServer
from tests.unit.human.test_messages import _message

T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def logbuf() -> Iterator[io.StringIO]:
    """All logging at DEBUG into a buffer (JSON lines), with the canary registered; restored afterwards."""
    with debug_log_buffer(TOKEN) as buf:
        yield buf


def _no_canary_in_files(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


# --------------------------------------------------------------------------------------------- backoff


class TestBackoff:
    @pytest.mark.parametrize(("attempts", "ceiling"), [(1, 5), (2, 10), (3, 20), (7, 320), (8, 600), (50, 600)])
    def test_ceiling(self, attempts: int, ceiling: float) -> None:
        """The delay's ceiling doubles per attempt up to the cap."""

        class Top:
            def uniform(self, a: float, b: float) -> float:
                return b

        at = next_attempt_at(attempts, T0, timedelta(seconds=5), timedelta(minutes=10), Top())
        assert at == T0 + timedelta(seconds=ceiling)

    @given(attempts=st.integers(min_value=0, max_value=10_000), seed=st.integers(min_value=0, max_value=2**32))
    def test_full_jitter_is_bounded(self, attempts: int, seed: int) -> None:
        """Any attempt count gives a time between now and now + cap (full jitter)."""
        cap = timedelta(minutes=15)
        at = next_attempt_at(attempts, T0, timedelta(seconds=5), cap, random.Random(seed))
        assert T0 <= at <= T0 + cap


# --------------------------------------------------------------------------------------------- outbox


class TestOutbox:
    async def test_retried_with_backoff_and_survives_restart(
        self, tg: FakeServer, tmp_path: Path, logbuf: io.StringIO
    ) -> None:
        """R-10: 500 then 429, then recovery: retried with backoff, delivered once, across a restart."""
        tg.respond(500, 429)
        rng = random.Random(7)
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        assert (tmp_path / "outbox" / "escalation-e-abc123.json").is_file()  # on disk before any send

        notifier = AppriseNotifier([f"tgram://{TOKEN}/4242"], registry=SecretRegistry([TOKEN]))
        report = await drain(outbox, notifier, T0, rng=rng)
        assert report.failed == [entry.id] and report.sent == []
        first = outbox.get(entry.id)
        assert first is not None and first.attempts == 1 and "error=500" in (first.last_error or "")
        assert T0 < first.next_at <= T0 + timedelta(seconds=5)

        # Not due yet: nothing is sent.
        report = await drain(outbox, notifier, first.next_at - timedelta(milliseconds=1), rng=rng)
        assert report.failed == report.sent == [] and len(tg.requests) == 1

        report = await drain(outbox, notifier, first.next_at, rng=rng)
        second = outbox.get(entry.id)
        assert report.failed == [entry.id] and second is not None and second.attempts == 2
        assert first.next_at < second.next_at <= first.next_at + timedelta(seconds=10)

        # Restart: new objects on the same directory.
        outbox2 = Outbox(tmp_path / "outbox")
        notifier2 = AppriseNotifier([f"tgram://{TOKEN}/4242"], registry=SecretRegistry([TOKEN]))
        assert outbox2.next_due() == second.next_at
        report = await drain(outbox2, notifier2, second.next_at, rng=rng)
        assert report.sent == [entry.id] and report.next_due is None
        assert outbox2.entries() == []
        assert [r[2] for r in tg.requests] == [500, 429, 200]  # delivered exactly once
        assert "Decision needed" in tg.delivered[0][1]["text"]
        assert TOKEN not in logbuf.getvalue()
        assert "notification_retry" in logbuf.getvalue()
        _no_canary_in_files(tmp_path)

    async def test_escalations_are_never_dropped(self, fake: FakeServer, tmp_path: Path) -> None:
        """An escalation failing for days is still retried; an info message is parked (not deleted)."""
        fake.respond(500, 500)
        outbox = Outbox(tmp_path / "outbox")
        esc = outbox.put(_message(), T0)
        info = outbox.put(Message(title="Run finished", body="3 items done"), T0)
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/hook"])
        later = T0 + timedelta(days=3)
        report = await drain(outbox, notifier, later, policy=RetryPolicy(give_up_after=timedelta(hours=24)))
        assert report.failed == [esc.id] and report.parked == [info.id]
        assert outbox.get(esc.id) is not None and outbox.get(info.id) is None
        assert (tmp_path / "outbox" / "expired" / f"{info.id}.json").is_file()
        report = await drain(outbox, notifier, later + timedelta(hours=1))
        assert report.sent == [esc.id]

    async def test_delivered_targets_are_not_sent_again(self, fake: FakeServer, tg: FakeServer, tmp_path: Path) -> None:
        """When one of two URLs fails, the retry goes only to the one that failed."""
        fake.respond(500, path="/hook")
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        urls = [f"tgram://{TOKEN}/4242", f"json://127.0.0.1:{fake.port}/hook"]
        await drain(outbox, AppriseNotifier(urls), T0)
        pending = outbox.get(entry.id)
        assert pending is not None and len(pending.delivered) == 1
        await drain(outbox, AppriseNotifier(urls), pending.next_at)
        assert outbox.get(entry.id) is None
        assert [p.split("/")[-1] for p, _, _ in fake.requests].count("sendMessage") == 1
        assert len(fake.requests) == 3 and fake.requests[2][0] == "/hook"

    async def test_a_message_put_for_one_channel_skips_the_others(
        self, fake: FakeServer, tg: FakeServer, tmp_path: Path
    ) -> None:
        """A channel that came up late is sent what the others had: the others' keys are skipped from the start."""
        outbox = Outbox(tmp_path / "outbox")
        urls = [f"tgram://{TOKEN}/4242", f"json://127.0.0.1:{fake.port}/hook"]
        notifier = AppriseNotifier(urls)
        hook_key = notifier.keys[1]
        entry = outbox.put(_message(), T0, skip=frozenset({hook_key}))
        assert entry.delivered == (hook_key,)
        report = await drain(outbox, notifier, T0)
        assert report.sent == [entry.id]
        assert [p.split("/")[-1] for p, _, _ in fake.requests] == ["sendMessage"]  # the bot only, not /hook

    def test_a_hastened_put_makes_a_waiting_entry_due_now(self, tmp_path: Path) -> None:
        """A channel that came up need not wait out the backoff the others' failures earned: the entry is due now,
        still one entry, with what it was delivered to kept."""
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        outbox.save(entry.model_copy(update={"next_at": T0 + timedelta(minutes=15), "delivered": ("apprise:x",)}))
        now = T0 + timedelta(minutes=1)
        assert outbox.put(_message(), now).next_at == T0 + timedelta(minutes=15)  # a plain put changes nothing
        hastened = outbox.put(_message(), now, hasten=True)
        assert hastened.next_at == now and hastened.delivered == ("apprise:x",)
        assert outbox.due(now) == [hastened] and len(outbox.entries()) == 1

    def test_put_is_deduplicated(self, tmp_path: Path) -> None:
        """Queueing the same message twice while it is pending keeps one entry."""
        outbox = Outbox(tmp_path / "outbox")
        a = outbox.put(_message(), T0)
        b = outbox.put(_message(), T0 + timedelta(minutes=5))
        assert a == b and len(outbox.entries()) == 1

    def test_odd_ids_get_safe_file_names(self, tmp_path: Path) -> None:
        """A dedupe id that is not a safe file name is hashed, never used as a path."""
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(Message(title="t", body="b", dedupe_id="../../etc/passwd"), T0)
        names = [p.name for p in (tmp_path / "outbox").iterdir()]
        assert len(names) == 1 and names[0].startswith("h-")
        assert outbox.get(entry.id) == entry

    async def test_notifier_crash_is_a_failed_attempt(self, tmp_path: Path) -> None:
        """A notifier raising an unexpected error counts as a failed attempt; the loop goes on."""

        class Broken:
            async def send(self, message: Message, *, skip: frozenset[str] = frozenset()) -> SendReport:
                raise RuntimeError(f"boom {TOKEN}")

        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        report = await drain(outbox, Broken(), T0)
        stored = outbox.get(entry.id)
        assert report.failed == [entry.id] and stored is not None
        assert "RuntimeError" in (stored.last_error or "") and TOKEN not in (stored.last_error or "")

    async def test_run_outbox_delivers_on_wake(self, fake: FakeServer, tmp_path: Path) -> None:
        """The drain loop sends a new message as soon as it is woken, and stops on request."""
        outbox = Outbox(tmp_path / "outbox")
        stop, wake = asyncio.Event(), asyncio.Event()
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/hook"])
        task = asyncio.create_task(run_outbox(outbox, notifier, clock=SystemClock(), stop=stop, wake=wake))
        outbox.put(_message(), SystemClock().now())
        wake.set()
        assert await async_wait_until(lambda: len(fake.delivered) == 1 and not outbox.entries(), timeout=10)
        stop.set()
        await asyncio.wait_for(task, 5)
