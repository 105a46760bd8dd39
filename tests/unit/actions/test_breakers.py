"""``ambient.actions.breakers``: a reset clears the breaker and answers the chains waiting on it, as data; the CLI
prints the same lines; the overview lists persisted breakers with the runs they stopped."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.actions.breakers import reset_breaker, tripped_breakers
from ambient.claims.breakers import Breaker
from ambient.cli import main
from ambient.core.errors import InputError
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.query.views import RunRow
from ambient.storage.paths import BrainPaths
from ambient.web.pages.overview import breaker_rows

T0 = datetime(2026, 3, 16, 20, 36, tzinfo=UTC)


@pytest.fixture
def paths(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    for sub in ("claims", "locks", "agents"):
        (root / sub).mkdir(parents=True)
    return BrainPaths(root)


def _trip(paths: BrainPaths, scope: str) -> None:
    breaker = Breaker(paths)
    for _ in range(3):
        breaker.fail(scope)


def _break_question(paths: BrainPaths, scope: str) -> str:
    esc = new_escalation(
        EscalationDraft(
            workflow="ship",
            run_id="run-7",
            kind="circuit_break",
            question=f"breaker tripped on {scope}",
            step="2",
            scope=scope,
            options=[("reset", "Reset", "reset"), ("abort", "Abort", "abort")],
        ),
        now=T0,
    )
    return EscalationStore(paths).create(esc).id


def test_reset_clears_the_breaker_and_answers_the_chain(paths: BrainPaths) -> None:
    _trip(paths, "be/")
    _trip(paths, "fe/")
    esc_id = _break_question(paths, "be/")
    assert [b.scope for b in tripped_breakers(paths)] == ["be/", "fe/"]
    done = reset_breaker(paths, "be/", by="ana", channel="web", note="from the console")
    assert done.scope == "be/" and [a for a, _ in done.answered] == [esc_id]
    assert done.lines[0] == "be/: breaker reset" and done.lines[1].startswith(f"{esc_id}: answered reset (")
    assert [b.scope for b in tripped_breakers(paths)] == ["fe/"]
    answered = EscalationStore(paths).get(esc_id)
    assert (answered.decision, answered.by, answered.channel) == ("reset", "ana", "web")
    assert reset_breaker(paths, "be/").lines == ["be/: breaker reset"]  # again: nothing left to answer


def test_reset_refuses_an_empty_target_and_an_unreadable_file(paths: BrainPaths) -> None:
    with pytest.raises(InputError, match="say which breaker"):
        reset_breaker(paths, "  ")
    (paths.state).mkdir(parents=True, exist_ok=True)
    (paths.state / "breaker.json").write_text("{nope")
    with pytest.raises(InputError, match="cannot be read"):
        reset_breaker(paths, "be/")
    assert (paths.state / "breaker.json").read_text() == "{nope"


def test_the_cli_prints_the_lines(
    paths: BrainPaths, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _trip(paths, "be/")
    esc_id = _break_question(paths, "be/")
    monkeypatch.setenv("USER", os.environ.get("USER") or "ana")  # put back after: a later `ambient decide` records it
    assert main(["--brain", str(paths.root), "preflight", "reset", "be/"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "be/: breaker reset" and lines[1].startswith(f"{esc_id}: answered reset (")
    assert lines[1].endswith("; the daemon runs the step again")


def _run(run_id: str, tripped: list[str]) -> RunRow:
    fields = {name: None for name in RunRow.__dataclass_fields__}
    return RunRow(**{**fields, "run_id": run_id, "workflow": "ship", "tripped": tripped})  # type: ignore[arg-type]


def test_breaker_rows_merge_the_file_and_the_runs(paths: BrainPaths) -> None:
    _trip(paths, "be/")
    rows = breaker_rows(tripped_breakers(paths), [_run("r1", ["./be//"]), _run("r2", ["ops/"])])
    got = [(r.scope, r.fails, [x.run_id for x in r.runs]) for r in rows]
    assert got == [("be/", 3, ["r1"]), ("ops/", None, ["r2"])]
