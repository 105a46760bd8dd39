"""The stale-claims evaluator of the daemon: open claims past their TTL become ``stale``, cheaply."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ambient.claims import new_claim
from ambient.claimstore import ClaimStore
from ambient.daemon import StaleClaimsEvaluator
from ambient.engine import Tick
from ambient.paths import BrainPaths
from ambient.yamltext import dump_yaml

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


async def test_claims_written_by_ambient_are_not_parsed_again(store: ClaimStore,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Item claims ambient wrote are judged from memory; a claim a person wrote is parsed; both go stale."""
    for k in range(5):
        store.write_claim(new_claim(f"sess-item-{k}", "satellite", f"projects/x/{k}.md", "coder", NOW), durable=False)
    store.write_claim(new_claim("sess-old-item", "satellite", "projects/x/old.md", "coder", NOW - timedelta(days=3)),
                      durable=False)
    by_hand = new_claim("sess-by-hand", "satellite", "projects/y.md", "person", NOW - timedelta(days=2))
    (store.dir / "sess-by-hand.yml").write_text(dump_yaml(by_hand.to_document()))

    reads: list[str] = []
    real_read = store.read

    def counting_read(path: Path) -> object:
        reads.append(path.name)
        return real_read(path)

    monkeypatch.setattr(store, "read", counting_read)
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


def test_batch_write_skips_a_broken_file_and_writes_the_others(store: ClaimStore) -> None:
    """write_claims (the writer thread's batch): a claim file a person broke is reported, kept, and not overwritten."""
    broken = store.dir / "sess-b.yml"
    broken.write_text("sess_id: [unclosed\n")
    batch = [new_claim(f"sess-{k}", "satellite", f"x/{k}.md", "coder", NOW) for k in ("a", "b", "c")]
    failed = store.write_claims(batch, durable=False)
    assert [sid for sid, _ in failed] == ["sess-b"]
    assert broken.read_text() == "sess_id: [unclosed\n"
    assert store.get("sess-a").scope == "x/a.md" and store.get("sess-c").scope == "x/c.md"
