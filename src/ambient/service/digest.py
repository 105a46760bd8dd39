"""The digest (``notify.digest``): results and automatic decisions gathered into one message per period instead of
one each. The escalator adds to it; as a tick evaluator it queues the digest in the outbox once its period is over.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

from ambient.core.clock import Clock
from ambient.engine.tick import Tick
from ambient.human.messages import Message
from ambient.human.outbox import Outbox
from ambient.learning.stats import summarise, weekly_digest
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, move
from ambient.storage.journal import append_line, read_jsonl
from ambient.storage.paths import BrainPaths


class Digest:
    """Results and automatic decisions gathered into one message every ``hours`` (``notify.digest``).

    Lines wait in ``.ambient/digest.jsonl`` (appended, fsync'd); when a digest is due they become one
    ``digest`` message in the outbox, with the escalation rate of the last weeks, and the file is
    rotated to ``digest.sent.jsonl``. Escalations never wait for a digest.
    """

    name = "digest"

    def __init__(
        self,
        paths: BrainPaths,
        outbox: Outbox,
        clock: Clock,
        hours: float,
        *,
        enabled: bool = True,
        wake_outbox: asyncio.Event | None = None,
    ) -> None:
        self.paths = paths
        self.outbox = outbox
        self.clock = clock
        self.hours = hours
        self.wake_outbox = wake_outbox  # a queued digest goes out at once, like any message (it sat in the outbox)
        self.enabled = enabled  # notify.digest, and somebody to send it to (set again at each reload)
        self.file = paths.state / "digest.jsonl"
        self.mark = paths.state / "digest.json"

    def add(self, title: str, body: str) -> None:
        append_line(self.file, {"at": self.clock.now().isoformat(), "title": title[:200], "body": body[:1000]})

    def _last_sent(self) -> datetime | None:
        try:
            return datetime.fromisoformat(json.loads(self.mark.read_text())["last_sent"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def due(self, now: datetime) -> bool:
        last = self._last_sent()
        if last is None:
            mark = json.dumps({"last_sent": now.isoformat()}) + "\n"
            atomic_write(self.mark, mark, mode=PRIVATE_FILE)  # the first period starts
            return False
        return now - last >= timedelta(hours=self.hours)

    def send_if_due(self) -> bool:
        """Blocking: compose and queue the digest when its period has passed and something waits (a period without
        a result or an automatic decision sends nothing)."""
        now = self.clock.now()
        if not self.due(now):
            return False
        lines = read_jsonl(self.file).records if self.file.exists() else []
        body: list[str] = []
        if lines:
            runs = read_jsonl(self.paths.runs_log).records if self.paths.runs_log.exists() else []
            body = [f"- {r.get('title')}: {r.get('body')}" for r in lines[-50:]]
            if len(lines) > 50:
                body.insert(0, f"(the {len(lines) - 50} earlier lines are in .ambient/digest.sent.jsonl)")
            if runs:
                body += ["", weekly_digest(summarise(runs))]
            title = f"ambient digest of the last {_period(self.hours)}: {len(lines)} update(s)"
            self.outbox.put(Message(title=title, body="\n".join(body)[:3800], kind="digest"), now)
        if self.file.exists():
            move(self.file, self.paths.state / "digest.sent.jsonl")
        atomic_write(self.mark, json.dumps({"last_sent": now.isoformat()}) + "\n", mode=PRIVATE_FILE)
        return bool(body)

    async def evaluate(self, tick: Tick) -> None:
        if tick.timed and self.enabled and await asyncio.to_thread(self.send_if_due) and self.wake_outbox is not None:
            self.wake_outbox.set()


def _period(hours: float) -> str:
    """``24`` → ``24 h``, ``168`` → ``7 days``, ``0.25`` → ``15 min``, ``0.001`` → ``3.6 s``."""
    if hours >= 48 and hours % 24 == 0:
        return f"{hours / 24:g} days"
    if hours >= 1:
        return f"{hours:g} h"
    if hours * 60 >= 1:
        return f"{hours * 60:g} min"
    return f"{hours * 3600:g} s"
