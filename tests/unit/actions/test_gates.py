"""``ambient.actions.gates``: the outcomes of ``ambient gate`` as data, the CLI printing the same words."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.actions.gates import move_gate, run_gate_question
from ambient.cli import main
from ambient.core.errors import AlreadyAnsweredError, InputError, TransitionError
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.storage.paths import BrainPaths

T0 = datetime(2026, 3, 16, 20, 36, tzinfo=UTC)


@pytest.fixture
def paths(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    for sub in ("claims", "locks", "agents"):
        (root / sub).mkdir(parents=True)
    return BrainPaths(root)


def _claim(paths: BrainPaths, sid: str, *extra: str) -> None:
    scope = [] if "--scope" in extra else ["--scope", f"{sid}/"]
    argv = ["claim", "open", "--sess-id", sid, "--type", "satellite", "--agent", "coder", *scope, *extra]
    assert main([*argv, "--brain", str(paths.root)]) == 0


def _gate_question(paths: BrainPaths, run_id: str = "run-7", step: str = "2") -> str:
    esc = new_escalation(
        EscalationDraft(
            workflow="ship",
            run_id=run_id,
            kind="gate",
            question="deploy?",
            step=step,
            options=[("approve", "Approve", "approve"), ("reject", "Reject", "reject")],
        ),
        now=T0,
    )
    return EscalationStore(paths).create(esc).id


def test_claim_moves_with_cascade(paths: BrainPaths) -> None:
    """gate then pause: the moves say from, to and which were cascaded; nothing else changes."""
    _claim(paths, "p", "--scope", "be/", "--satellite-type", "domain", "--satellite-level", "domain")
    _claim(paths, "c", "--scope", "be/x/", "--satellite-type", "code", "--parent", "p", "--force")
    done = move_gate(paths, "p", "gate", "deploy now?")
    assert done.question is None and done.message == "p: open -> waiting_human"
    assert done.statuses() == {"p": "waiting_human"}
    done = move_gate(paths, "p", "approve")
    assert done.statuses() == {"p": "open"}
    paused = move_gate(paths, "p", "pause", "lunch")
    assert [(m.sess_id, m.before, m.after, m.cascade) for m in paused.moves] == [
        ("p", "open", "paused", False),
        ("c", "open", "paused", True),
    ]


def test_refusals_raise_and_change_nothing(paths: BrainPaths) -> None:
    """An illegal move, an unknown claim, an unknown action: the store's errors, files untouched."""
    _claim(paths, "p")
    before = (paths.claims / "p.yml").read_bytes()
    with pytest.raises(TransitionError, match="cannot approve claim p: it is open"):
        move_gate(paths, "p", "approve")
    with pytest.raises(TransitionError, match="no claim 'nope'"):
        move_gate(paths, "nope", "abort")
    with pytest.raises(InputError, match="unknown gate action"):
        move_gate(paths, "p", "launch")
    assert (paths.claims / "p.yml").read_bytes() == before


def test_run_gate_is_answered_as_decide_would(paths: BrainPaths) -> None:
    """Approve on a run step's claim answers the run's gate question (by whom, through which door)."""
    esc_id = _gate_question(paths)
    assert run_gate_question(paths, "run-7-step-2") is not None
    assert run_gate_question(paths, "run-7-step-3") is None
    done = move_gate(paths, "run-7-step-2", "approve", "ship it", by="ada", channel="web")
    assert done.question == esc_id and done.decision == "approve" and not done.moves
    assert "answered as `ambient decide` would" in done.message
    esc = EscalationStore(paths).get(esc_id)
    assert (esc.status, esc.by, esc.channel, esc.note) == ("answered", "ada", "web", "ship it")
    assert run_gate_question(paths, "run-7-step-2") is None  # answered: no longer pending


def test_cli_prints_the_outcome_and_exit_codes(paths: BrainPaths, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the action's message (0); an answered gate is no run's question any more; illegal: 2."""
    esc_id = _gate_question(paths)
    assert main(["gate", "reject", "run-7-step-2", "--brain", str(paths.root)]) == 0
    assert f"run-7-step-2: reject (the run's question {esc_id}" in capsys.readouterr().out
    with pytest.raises(AlreadyAnsweredError):
        EscalationStore(paths).answer(esc_id, "approve", by="ada", channel="web")
    assert main(["gate", "approve", "run-7-step-2", "--brain", str(paths.root)]) == 2
    assert "no claim 'run-7-step-2'" in capsys.readouterr().err
    _claim(paths, "q")
    assert main(["gate", "approve", "q", "--brain", str(paths.root)]) == 2
    assert "cannot approve claim q" in capsys.readouterr().err


def test_the_gate_actions_offered_follow_the_transition_rule() -> None:
    from ambient.actions.gates import gate_actions_for
    from ambient.claims.claim import STATUSES, TRANSITIONS, legal_actions

    assert gate_actions_for("open") == ("gate", "pause", "abort")
    assert gate_actions_for("waiting_human") == ("approve", "reject", "pause", "abort")
    assert gate_actions_for("paused") == ("resume", "abort")
    assert gate_actions_for("stale") == ("abort",)
    assert gate_actions_for("closed") == gate_actions_for("failed") == gate_actions_for("nonsense") == ()
    for status in STATUSES:  # one rule: every action offered is one the transition accepts
        assert all(status in TRANSITIONS[a][0] for a in legal_actions(status))
    assert legal_actions("stale") == ("abort", "close")


def test_an_item_waiting_on_a_question_is_not_approved_through_its_claim(paths: BrainPaths) -> None:
    """A run's item whose agent asked (or failed) waits on that question, named in its claim (``escalation:``):
    approving the claim moved it on and left the run waiting (a new user's finding). Refused, naming the question;
    once answered, the claim is the person's to move again."""
    esc = new_escalation(
        EscalationDraft(
            workflow="deploy",
            run_id="run-8",
            kind="fail",
            question="instance-07 failed. Retry?",
            item="instance-07",
            options=[("retry", "Retry", "retry"), ("skip", "Skip", "skip")],
        ),
        now=T0,
    )
    esc_id = EscalationStore(paths).create(esc).id
    _claim(paths, "run-8-item-007")
    move_gate(paths, "run-8-item-007", "gate", "waiting")
    claim_file = paths.claims / "run-8-item-007.yml"
    claim_file.write_text(claim_file.read_text() + f"escalation: {esc_id}\n")
    before = claim_file.read_bytes()
    for action in ("approve", "reject"):
        with pytest.raises(TransitionError, match=rf"waits on its run's question {esc_id} \(fail\).*retry, skip"):
            move_gate(paths, "run-8-item-007", action)
    assert claim_file.read_bytes() == before
    assert move_gate(paths, "run-8-item-007", "pause").statuses() == {"run-8-item-007": "paused"}  # not an answer
    EscalationStore(paths).answer(esc_id, "skip", by="ada", channel="cli")
    move_gate(paths, "run-8-item-007", "resume")
    assert move_gate(paths, "run-8-item-007", "approve").statuses() == {"run-8-item-007": "open"}  # answered: free
