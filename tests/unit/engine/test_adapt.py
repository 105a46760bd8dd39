"""What an ADAPT or ABORT packet does to a run, as pure rules over the folded state: which runs a packet names,
which items an ADAPT skips (and why the others are not), and what the questions of a run an ABORT ended say."""

from __future__ import annotations

from ambient.engine import events
from ambient.engine.planner import adapt_skips, names_run
from ambient.engine.runstate import ItemState, RunState, ended_because, fold, outcome_of

AT = "2026-01-02T03:04:05.000+00:00"


def _state(
    form: str = "for_each", statuses: tuple[str, ...] = ("running", "pending", "retry_wait", "done")
) -> RunState:
    items = [ItemState(name=f"i{n}", index=n, status=s) for n, s in enumerate(statuses)]  # type: ignore[arg-type]
    return RunState(run_id="sess-1", workflow="fan", form=form, spec_hash=None, spec={}, items=items)


def test_a_packet_names_a_run_by_its_id_or_its_workflow() -> None:
    """A run id names that run alone; a workflow's name every run of it; anything else none."""
    assert names_run("sess-1", "sess-1", "fan")
    assert names_run("fan", "sess-1", "fan")
    assert not names_run("sess-2", "sess-1", "fan")
    assert not names_run("", "sess-1", "fan")


def test_adapt_skips_items_not_started_and_says_why_it_skips_no_other() -> None:
    """Pending and retry_wait items are skipped; a running, finished or unknown one is not, each with its reason;
    a name given twice counts once."""
    skip, refused = adapt_skips(_state(), ["i1", "i2", "i0", "i3", "ghost", "i1"])
    assert skip == ["i1", "i2"]
    assert set(refused) == {"i0", "i3", "ghost"}
    assert "running" in refused["i0"] and "done" in refused["i3"] and "no item 'ghost'" in refused["ghost"]


def test_adapt_skips_nothing_of_a_chain_or_an_ended_run() -> None:
    """A chain's steps are not a fan-out's items, and a run that ended changes no more: every name says so."""
    skip, refused = adapt_skips(_state(form="chain"), ["i1"])
    assert skip == [] and "for_each" in refused["i1"]
    ended = _state()
    ended.outcome = "success"
    skip, refused = adapt_skips(ended, ["i1"])
    assert skip == [] and "ended" in refused["i1"]


def test_a_skip_by_adapt_keeps_its_reason_and_an_abort_packet_says_who_and_why() -> None:
    """Folded from the journal: an item an ADAPT skipped says so (its claim shows it), and the questions an ABORT
    packet left behind are cancelled with its sender and reason."""
    records = [
        events.started(AT, run_id="sess-1", workflow="fan", form="for_each", items=["a", "b"]),
        events.skipped(AT, item="b", reason="skipped by an ADAPT from human"),
        events.abort(AT, by="human", reason="wrong release"),
        events.finished_run(AT, outcome="aborted"),
    ]
    state = fold(records)
    assert [(i.status, i.error) for i in state.items] == [
        ("aborted", None),
        ("skipped", "skipped by an ADAPT from human"),
    ]
    assert outcome_of(state) == "aborted"
    assert ended_because(state) == "the run was aborted by human: wrong release"
