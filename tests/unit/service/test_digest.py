"""The digest tested alone: information batched until its period is over."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ambient.human.outbox import Outbox
from ambient.service.digest import Digest
from ambient.storage.paths import BrainPaths


class Clock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        return 0.0


def test_digest_batches_information_until_its_period(tmp_path: Path) -> None:
    """Results wait in the digest file; one digest message is queued per period, then the file rotates."""
    paths = BrainPaths(tmp_path)
    paths.state.mkdir()
    clock = Clock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    outbox = Outbox.for_brain(paths)
    digest = Digest(paths, outbox, clock, hours=24)
    assert digest.send_if_due() is False  # the first period starts now
    digest.add("deploy-batch: success", "10/10 done")
    digest.add("docs-refresh: decided by a learned rule", "retry")
    clock.t += timedelta(hours=23)
    assert digest.send_if_due() is False and outbox.entries() == []
    clock.t += timedelta(hours=2)
    assert digest.send_if_due() is True
    (entry,) = outbox.entries()
    assert entry.message.kind == "digest" and "10/10 done" in entry.message.body
    assert entry.message.title == "ambient digest of the last 24 h: 2 update(s)"
    assert not (paths.state / "digest.jsonl").exists() and (paths.state / "digest.sent.jsonl").exists()
    assert json.loads((paths.state / "digest.json").read_text())["last_sent"].startswith("2026-12-01")
    clock.t += timedelta(hours=25)  # a period without a result or an automatic decision sends nothing
    assert digest.send_if_due() is False and len(outbox.entries()) == 1
