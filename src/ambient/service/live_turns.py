"""The live threads' turns (DESIGN: live context): every packet delivered and every AI agent's turn (a message, a
tool call, its result, a denial) goes to its agent's thread, gathered on the loop and written in batches by a writer
thread of its own; and ``.ambient/now.json``, the tool each AI agent is using right now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from ambient.core.clock import Clock
from ambient.core.errors import AmbientError
from ambient.core.lazylog import get_logger
from ambient.core.redact import SecretRegistry, redact_text
from ambient.kernel.packet import Packet
from ambient.kernel.router import Router
from ambient.live.context import LiveContext
from ambient.live.turn import turn_record
from ambient.runners.base import RunRequest
from ambient.service.writer_threads import background_executor
from ambient.storage.fsutil import atomic_write
from ambient.storage.paths import NOW_FILE, BrainPaths

log = get_logger(__name__)


class LiveTurns:
    """The turns waiting for their live threads, and the thread that writes them (turns no agent waits for: see
    :mod:`~.writer_threads`)."""

    def __init__(
        self,
        paths: BrainPaths,
        live: LiveContext,
        router: Router,
        clock: Clock,
        secrets: SecretRegistry,
        current: Callable[[], Iterable[dict[str, Any]]],
    ) -> None:
        self.paths = paths
        self.live = live
        self.router = router
        self.clock = clock
        self.secrets = secrets  # masked in an AI agent's turns before anything is kept
        self.current = current  # what each AI agent is doing now (the Claude runner's view)
        self._packets: list[Packet] = []
        self._turns: list[dict[str, Any]] = []  # AI agents' turns (see watch)
        self._now_written: list[dict[str, Any]] | None = None
        self._writer = background_executor("live")

    async def deliver(self, pkt: Packet) -> None:
        """Every delivered packet goes to its agent's live thread (batched off the loop)."""
        self._packets.append(pkt)

    async def run(self, stop: asyncio.Event) -> None:
        """Write what came in every quarter of a second until ``stop`` (the daemon's ``live`` task)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
            await self.flush()

    def _write_now(self) -> None:
        """``.ambient/now.json``: the tool each AI agent is using right now (``ambient status`` shows it), written
        when it changes; a view, not durable."""
        current = sorted(self.current(), key=lambda c: (c["run_id"], c["item"]))
        if current == self._now_written:
            return
        self._now_written = current
        try:
            atomic_write(self.paths.state / NOW_FILE, json.dumps(current).encode(), mode=0o600, durable=False)
        except OSError as exc:
            log.warning("now_view_failed", error=str(exc))

    def watch(self, req: RunRequest, kind: str, text: str) -> None:
        """An AI agent's turn (a message, a tool call, its result, a denial) for its live thread, batched like the
        packets' turns; secrets masked before anything is kept."""
        self._turns.append(
            {
                "ts": self.clock.now().isoformat(),
                "target": req.agent,
                "requester": str(req.packet.get("from") or "ambient"),  # the SPAWN's sender: its conversation
                "correlation_id": req.key,
                "role": "agent",
                "source": "runner",
                "signal": kind.upper(),
                "text": redact_text(text, self.secrets),
            }
        )

    async def flush(self) -> None:
        """Write what came in since the last time (and the router's buffered audit lines, and ``now.json``)."""
        self.router.flush()  # the audit log is buffered by the router; push it out with the live threads
        self._write_now()
        batch, self._packets = self._packets, []
        turns, self._turns = self._turns, []
        if not batch and not turns:
            return

        def write() -> None:
            records: list[dict[str, Any]] = list(turns)
            for pkt in batch:
                try:
                    rec = turn_record(pkt.wire_view(), ts=pkt.ts, correlation_id=pkt.correlation_id)
                except (AmbientError, ValueError) as exc:
                    log.warning("live_context_append_failed", error=str(exc))
                    continue
                if rec is not None:
                    records.append(rec)
            try:
                self.live.append_records(records)
            except (AmbientError, OSError) as exc:
                log.warning("live_context_append_failed", error=str(exc))

        await asyncio.get_running_loop().run_in_executor(self._writer, write)

    def close(self) -> None:
        """Wait for the last batch and stop the writer thread (after a last :meth:`flush`)."""
        self._writer.shutdown(wait=True)
