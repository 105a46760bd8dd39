"""docs/escalations-and-notifications.md: what waits for the person, how it is answered (`ambient decide`, a
Telegram button), deadlines, and the notifications that reach a loopback webhook or a fake Telegram Bot API."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.acceptance.harness import Brain, FakeTelegram, Webhook, ambient, wait

# ---------------------------------------------------------------- agents and workflows

#: Fails its first attempt (exit 1, a business failure), succeeds when run again.
FLAKY = """
    import json, os, sys
    json.load(sys.stdin)
    if os.environ["AMBIENT_ATTEMPT"] == "1":
        print("the instance is down", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"status": "ok"}))
"""

#: Always fails.
FAILING = """
    import json, sys
    json.load(sys.stdin)
    print("the instance is down", file=sys.stderr)
    sys.exit(1)
"""

OK = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""


def _rollout(
    brain: Brain,
    name: str = "rollout",
    items: tuple[str, ...] = ("eu-1",),
    agent: str = "deploy",
    extra: str = "",
    on_fail: str | None = None,
) -> None:
    """Drop a for_each of AGENT over ITEMS (each on infrastructure/<name>/<item>.yml); EXTRA: top-level lines."""
    lines = [
        f"workflow: {name}",
        "for_each:",
        f"  items: [{', '.join(items)}]",
        f"  spawn: {agent}",
        f"  concurrency: {len(items)}",
        '  scope: {zone: project, files: ["infrastructure/' + name + '/{{item}}.yml"]}',
    ]
    if on_fail is not None:
        lines += ["  on_return:", f"    fail: {on_fail}"]
    brain.write(f"workflows/{name}.yml", "\n".join(lines) + "\n" + extra)


def _esc_file(brain: Brain, esc_id: str) -> Path:
    return brain.root / ".ambient" / "escalations" / f"{esc_id}.yml"


def _esc_yaml(brain: Brain, esc_id: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(_esc_file(brain, esc_id).read_text())
    return data


def _all(brain: Brain) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in brain.escalations(all=True)}


def _tree_digest(root: Path) -> str:
    """One hash over every file under ROOT (names and contents): "nothing changed" made checkable."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _outbox(brain: Brain) -> list[dict[str, Any]]:
    out = []
    for path in sorted((brain.root / ".ambient" / "outbox").glob("*.json")):
        if not path.name.startswith("."):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # replaced between the listing and the read
    return out


def _refs(texts: list[str]) -> list[str]:
    return [m for t in texts for m in re.findall(r"Ref: (esc-[A-Za-z0-9]+)", t)]


# ---------------------------------------------------------------- the escalation file and its fields


def test_a_failed_item_becomes_an_escalation_file_with_the_documented_fields(brain: Brain) -> None:
    """An escalation is `.ambient/escalations/<id>.yml` holding workflow, run, item, agent, question, options,
    deadline and notification attempts; once answered, the decision, who, channel, when and the latency."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain, extra="on_escalate: {timeout: 24h, on_timeout: reject}\n")
    brain.until_idle()
    [esc] = brain.escalations()
    [run] = brain.status()["runs"]
    on_disk = _esc_yaml(brain, esc["id"])
    assert on_disk["id"] == esc["id"]
    assert on_disk["workflow"] == "rollout"
    assert on_disk["item"] == "eu-1"
    assert on_disk["agent"] == "deploy"
    assert on_disk["run_id"] == run["run_id"]
    assert "the instance is down" in on_disk["question"]
    assert [o["key"] for o in on_disk["options"]] == ["retry", "skip", "abort"]
    assert abs(_when(on_disk["deadline"]) - _when(on_disk["created_at"]) - 24 * 3600) < 5
    assert "attempts" in on_disk["notify"]
    assert on_disk["status"] == "pending"

    assert brain.decide(esc["id"], "skip", "--note", "known outage").rc == 0
    answered = _esc_yaml(brain, esc["id"])
    assert answered["status"] == "answered"
    assert answered["decision"] == "skip"
    assert answered["by"] == "human"
    assert answered["channel"] == "cli"
    assert answered["note"] == "known outage"
    assert _when(answered["answered_at"]) >= _when(answered["created_at"])
    assert isinstance(answered["latency_s"], int | float) and answered["latency_s"] >= 0


def test_a_blocked_on_that_needs_you_becomes_an_escalation(brain: Brain) -> None:
    """A BLOCKED_ON that needs the person becomes an escalation file too."""
    brain.python_agent(
        "blocker",
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"signal": "BLOCKED_ON", "context": {"missing": "the VPN key"}}))
    """,
    )
    _rollout(brain, name="blk", agent="blocker", items=("x",))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "blocked"
    assert (esc["workflow"], esc["item"], esc["agent"]) == ("blk", "x", "blocker")
    assert _esc_file(brain, esc["id"]).is_file()
    assert [o["key"] for o in esc["options"]] == ["retry", "skip", "abort"]


def test_a_blocked_on_escalation_says_what_is_missing(brain: Brain) -> None:
    """blocked → BLOCKED_ON → you unblock: the person is told what the agent is blocked on."""
    brain.python_agent(
        "blocker",
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"signal": "BLOCKED_ON", "context": {"missing": "the VPN key"}}))
    """,
    )
    _rollout(brain, name="blk", agent="blocker", items=("x",))
    brain.until_idle()
    [esc] = brain.escalations()
    assert "the VPN key" in brain.ok("escalations").out
    assert "the VPN key" in esc["question"]


def test_an_escalate_with_a_long_option_becomes_an_escalation(brain: Brain) -> None:
    """Every ESCALATE becomes an escalation, also one whose options are long (the packet bound is 512 characters)."""
    brain.python_agent(
        "asker",
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"signal": "ESCALATE", "question": "Which plan?",
                          "options": ["keep the current plan: " + "a" * 280, "switch"]}))
    """,
    )
    _rollout(brain, name="ask", agent="asker", items=("x",))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["question"] == "Which plan?"
    assert brain.finished("ask") == []


def test_a_chain_steps_escalation_holds_its_step(brain: Brain) -> None:
    """An escalation holds the item *or step* it is about: a failed chain step's escalation names its step."""
    brain.python_agent("failer", FAILING)
    brain.workflow(
        "ch",
        """
        name: ch
        chain:
          - {step: 1, type: brain-write, scope: workspace/ch/a.md, agents: [failer]}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["workflow"] == "ch"
    assert str(esc["step"]) == "1", esc


def test_identical_escalations_are_not_opened_twice(brain: Brain) -> None:
    """Identical escalations are not opened twice: not after a crash of the daemon, not at each start."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain, items=("eu-1", "eu-2"))
    with brain.daemon() as daemon:
        first = {e["id"] for e in brain.wait_escalation("the two failed items", count=2)}
        daemon.kill()
    brain.until_idle()
    brain.until_idle()
    assert {e["id"] for e in brain.escalations(all=True)} == first
    assert len(list((brain.root / ".ambient" / "escalations").glob("*.yml"))) == 2


def test_escalations_lists_what_waits_and_all_shows_the_answered(brain: Brain) -> None:
    """`ambient escalations` lists what waits (numbered options, the command to answer); `--all` also the answered;
    `--json` the stored fields."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain, items=("eu-1", "eu-2"))
    brain.until_idle()
    res = brain.ok("escalations")
    escs = sorted(brain.escalations(), key=lambda e: e["item"])
    for esc in escs:
        assert esc["id"] in res.out
    assert "1) retry" in res.out and "2) skip" in res.out and "3) abort" in res.out
    assert f"ambient --brain {brain.root} decide {escs[0]['id']}" in res.out  # asked with --brain: it is named
    assert "the instance is down" in res.out

    brain.decide(escs[0]["id"], "skip")
    pending = brain.ok("escalations")
    assert escs[0]["id"] not in pending.out and escs[1]["id"] in pending.out
    everything = brain.ok("escalations", "--all")
    assert escs[0]["id"] in everything.out and "answered: skip" in everything.out
    stored = {e["id"]: e for e in brain.escalations(all=True)}
    assert stored[escs[0]["id"]]["status"] == "answered"
    assert stored[escs[1]["id"]]["status"] == "pending"
    brain.decide(escs[1]["id"], "skip")
    assert "No pending escalations" in brain.ok("escalations").out
    assert brain.escalations() == []


def test_escalations_names_the_brain_in_the_command_to_answer_as_status_does(brain: Brain) -> None:
    """`ambient --brain DIR escalations` prints `answer: ambient --brain DIR decide …`, the
    command to copy from any directory, as `ambient status` does; in the brain itself, `ambient decide …`."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    named = brain.ok("escalations").out
    assert f"answer: ambient --brain {brain.root} decide {esc['id']} <number or name>" in named, named
    assert f"ambient --brain {brain.root} decide {esc['id']} <option>" in brain.ok("status").out
    here = ambient("escalations", cwd=brain.root)
    assert f"answer: ambient decide {esc['id']} <number or name>" in here.out, here


def test_decide_by_number_or_name_with_or_without_the_prefix(brain: Brain) -> None:
    """`ambient decide esc-ID 1` by number, `ambient decide ID NAME --note T` by name, the esc- prefix optional."""
    brain.python_agent("deploy", FLAKY)
    _rollout(brain, items=("eu-1", "eu-2", "eu-3"))
    brain.until_idle()
    escs = {e["item"]: e for e in brain.escalations()}
    assert set(escs) == {"eu-1", "eu-2", "eu-3"}
    by_number = brain.decide(escs["eu-1"]["id"], "1")
    assert by_number.rc == 0, by_number
    bare = escs["eu-2"]["id"].removeprefix("esc-")
    assert brain.decide(bare, "skip", "--note", "flaky").rc == 0
    assert brain.decide(escs["eu-3"]["id"], "retry").rc == 0
    stored = _all(brain)
    assert stored[escs["eu-1"]["id"]]["decision"] == "retry"
    assert (stored[escs["eu-2"]["id"]]["decision"], stored[escs["eu-2"]["id"]]["note"]) == ("skip", "flaky")
    brain.until_idle()
    [record] = brain.finished("rollout")
    steps = {(s["item"], s["attempt"]): s["result"] for s in record["steps"]}
    assert steps.get(("eu-1", 2)) == steps.get(("eu-3", 2)) == "success", record
    assert ("eu-2", 2) not in steps


def test_decide_exit_codes_and_a_refused_answer_changes_nothing(brain: Brain) -> None:
    """`decide` exits 0 when it decided, 1 if already answered, 2 for an unknown id or an option not offered; a refused
    answer changes nothing."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    before = _tree_digest(brain.root)
    for esc_id, option in (
        (esc["id"], "bogus"),
        (esc["id"], "4"),
        (esc["id"], "0"),
        ("esc-nobody", "1"),
        ("nobody", "retry"),
    ):
        res = brain.decide(esc_id, option)
        assert res.rc == 2, res
    assert _tree_digest(brain.root) == before
    assert brain.decide(esc["id"], "skip").rc == 0
    after = _tree_digest(brain.root)
    late = brain.decide(esc["id"], "retry")
    assert late.rc == 1, late
    assert "already answered" in late.err
    assert _tree_digest(brain.root) == after
    assert _all(brain)[esc["id"]]["decision"] == "skip"


def test_decide_with_a_misspelt_option_says_the_option_it_looks_like(brain: Brain) -> None:
    """`ambient decide ID aprove` is refused (exit 2, nothing changes) with the options offered and the one it looks
    like: `did you mean 'approve'?`, as a misspelt command is told."""
    brain.python_agent("worker", OK)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert "approve" in [o["key"] for o in esc["options"]], esc
    before = _tree_digest(brain.root)
    res = brain.decide(esc["id"], "aprove")
    assert res.rc == 2, res
    assert "does not offer 'aprove'" in res.err and "approve" in res.err.split("does not offer", 1)[1], res
    assert "did you mean 'approve'?" in res.err, res
    assert _tree_digest(brain.root) == before
    far = brain.decide(esc["id"], "maybe")
    assert far.rc == 2 and "did you mean" not in far.err, far
    assert brain.decide(esc["id"], "approve").rc == 0


def test_the_running_daemon_resumes_at_once_when_you_decide(brain: Brain) -> None:
    """The running daemon sees the answer at once (a file event, not its 30 s tick) and resumes the run."""
    brain.python_agent("deploy", FLAKY)
    _rollout(brain)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        decided = time.monotonic()
        assert brain.decide(esc["id"], "retry").rc == 0
        [record] = brain.wait_finished("rollout", timeout=15)
        assert time.monotonic() - decided < 15
        daemon.wait_log("decision_applied", escalation=esc["id"])
    assert record["outcome"] == "success"


# ---------------------------------------------------------------- deadlines


def test_on_timeout_applies_at_the_deadline_and_a_late_answer_is_refused(brain: Brain) -> None:
    """`on_escalate: {timeout, on_timeout: abort}`: at the deadline the escalation expires with that answer; a late
    `decide` exits 1 and changes nothing."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("deploy", FAILING)
    _rollout(brain, extra="on_escalate: {timeout: 2s, on_timeout: abort}\n")
    with brain.daemon():
        [esc] = brain.wait_escalation()
        assert abs(_when(esc["deadline"]) - _when(esc["created_at"]) - 2) < 0.5
        [record] = brain.wait_finished("rollout")
    assert record["outcome"] == "aborted"
    stored = _all(brain)[esc["id"]]
    assert stored["status"] == "expired"
    assert stored["decision"] == "abort"
    assert stored["by"] == "timeout"
    assert _when(stored["timed_out_at"]) >= _when(stored["deadline"])
    before = _tree_digest(brain.root)
    late = brain.decide(esc["id"], "retry")
    assert late.rc == 1, late
    assert "timeout" in late.err or "expired" in late.err, late
    assert _tree_digest(brain.root) == before


def test_an_abort_at_a_deadline_cancels_the_siblings_saying_why(brain: Brain) -> None:
    """`on_timeout: abort` ends the run as your `abort` would: a sibling still waiting is cancelled, and says the
    run was aborted, by whom and on which item."""
    brain.shell_agent("deploy", 'cat > /dev/null\n[ "$AMBIENT_ITEM" = eu-2 ] && sleep 1\nexit 1\n')
    _rollout(brain, items=("eu-1", "eu-2"), extra="on_escalate: {timeout: 2s, on_timeout: abort}\n")
    with brain.daemon():
        [record] = brain.wait_finished("rollout")
    assert record["outcome"] == "aborted", record
    by_item = {e["item"]: e for e in _all(brain).values()}
    assert (by_item["eu-1"]["status"], by_item["eu-1"]["by"]) == ("expired", "timeout"), by_item
    assert by_item["eu-2"]["status"] == "cancelled", by_item
    late = brain.decide(by_item["eu-2"]["id"], "retry")
    assert late.rc == 1 and "the run was aborted: abort on eu-1 by timeout" in late.err, late


def test_on_timeout_approve_gives_a_failed_items_escalation_an_end(brain: Brain) -> None:
    """`on_timeout: approve` gives a failed item's escalation an end: at the deadline the run goes on without you."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("deploy", FLAKY)
    _rollout(brain, extra="on_escalate: {timeout: 1s, on_timeout: approve}\n")
    with brain.daemon():
        [esc] = brain.wait_escalation()
        wait(lambda: _all(brain)[esc["id"]]["status"] != "pending", "the deadline")
        waiting = [r for r in brain.status()["runs"] if r["workflow"] == "rollout" and r["waiting"]]
        pending = brain.escalations()
        assert not (waiting and not pending), "the run waits on you, and nothing is left for you to answer"
        brain.wait_finished("rollout", timeout=10)


def test_on_timeout_escalate_keeps_the_escalation_answerable(brain: Brain) -> None:
    """`on_timeout: escalate` decides nothing for you: past the deadline the escalation still waits for your answer."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("deploy", FLAKY)
    _rollout(brain, extra="on_escalate: {timeout: 1s, on_timeout: escalate}\n")
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        daemon.wait_log("escalation_timed_out", escalation=esc["id"])
        [still] = brain.escalations()
        assert still["id"] == esc["id"] and still["status"] == "pending" and still["decision"] is None
        assert brain.decide(esc["id"], "retry").rc == 0
        [record] = brain.wait_finished("rollout")
    assert record["outcome"] == "success"


@pytest.mark.slow
def test_a_deadline_survives_a_restart(brain: Brain) -> None:
    """Deadlines are absolute timestamps on disk: a restart does not reset them."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("deploy", FAILING)
    _rollout(brain, extra="on_escalate: {timeout: 6s, on_timeout: abort}\n")
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        assert daemon.stop() == 0
    deadline = _when(_esc_yaml(brain, esc["id"])["deadline"])
    wait(lambda: time.time() > deadline + 0.2, "the deadline to pass while the daemon is down", timeout=15)
    assert brain.escalations()[0]["id"] == esc["id"]  # nothing expires without a daemon
    with brain.daemon():
        restarted = time.monotonic()
        wait(lambda: _all(brain)[esc["id"]]["status"] == "expired", "the escalation to expire", timeout=5)
        assert time.monotonic() - restarted < 5  # a deadline reset at the restart would expire 6 s later
        [record] = brain.wait_finished("rollout")
    assert record["outcome"] == "aborted"
    assert _when(_esc_yaml(brain, esc["id"])["deadline"]) == deadline


# ---------------------------------------------------------------- notifications (apprise json:// on 127.0.0.1)


class _WitnessHook(Webhook):
    """A webhook that notes, for each escalation it receives, whether its file was already on disk."""

    def __init__(self, brain: Brain) -> None:
        super().__init__()
        self.brain = brain
        self.file_there: dict[str, bool] = {}

    def handle(self, path: str, body: Any) -> tuple[int, Any]:
        for ref in _refs([str(body.get("message", ""))]):
            self.file_there.setdefault(ref, _esc_file(self.brain, ref).exists())
        return super().handle(path, body)


def _notify(brain: Brain, *urls: str, extra: str = "") -> None:
    brain.config("notify:\n  urls: [" + ", ".join(f'"{u}"' for u in urls) + "]\n" + extra)


def test_an_escalation_is_notified_at_once_after_its_file_is_written(brain: Brain) -> None:
    """ "Needs you" is sent at once, with the question, the options and the command to answer, and only once the
    escalation file is on disk."""
    with _WitnessHook(brain) as hook:
        _notify(brain, hook.url)
        brain.python_agent("deploy", FAILING)
        _rollout(brain)
        with brain.daemon():
            [esc] = brain.wait_escalation()
            wait(lambda: esc["id"] in _refs(hook.texts()), "the escalation's notification")
        [text] = [t for t in hook.texts() if f"Ref: {esc['id']}" in t]
        assert "the instance is down" in text
        assert "1. retry" in text and "2. skip" in text and "3. abort" in text
        assert f"ambient decide {esc['id']}" in text
        assert hook.file_there == {esc["id"]: True}


def test_the_escalation_file_records_its_notification_attempts(brain: Brain, webhook: Webhook) -> None:
    """The escalation file holds its notification attempts; `ambient status` says whether it was notified."""
    _notify(brain, webhook.url)
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon():
        [esc] = brain.wait_escalation()
        wait(lambda: esc["id"] in _refs(webhook.texts()), "the escalation's notification")
        wait(brain.outbox_empty, "the outbox to empty")
        status = brain.ok("status").out
        attempts = _esc_yaml(brain, esc["id"])["notify"]
    assert "not delivered" not in status, status
    assert attempts["count"] >= 1 and attempts["attempts"][-1]["ok"] is True, attempts
    assert attempts["delivered_at"] is not None


@pytest.mark.parametrize(("setting", "expected"), [("none", set()), ("failures", {"bad"}), ("all", {"good", "bad"})])
def test_notify_results_none_failures_all(brain: Brain, webhook: Webhook, setting: str, expected: set[str]) -> None:
    """Finished runs are information, sent per `notify.results` (none | failures | all); escalations always."""
    _notify(brain, webhook.url, extra=f"  results: {setting}\n")
    brain.python_agent("okay", OK)
    brain.python_agent("deploy", FAILING)
    _rollout(brain, name="good", agent="okay")
    _rollout(brain, name="bad", agent="deploy", on_fail="→ next_item")
    with brain.daemon():
        brain.wait_finished("good")
        [bad] = brain.wait_finished("bad")
        assert bad["outcome"] != "success"
        # a sentinel: an escalation (always sent) dropped after both runs finished
        brain.python_agent("asker", FAILING)
        _rollout(brain, name="sentinel", agent="asker")
        [esc] = brain.wait_escalation()
        wait(lambda: esc["id"] in _refs(webhook.texts()), "the sentinel escalation's notification")
        wait(brain.outbox_empty, "the outbox to empty")
    titles = [p.get("title", "") for p in webhook.posts]
    results = {t.split(":")[0] for t in titles if not t.startswith("Decision needed")}
    assert results == expected, titles


def test_a_failed_send_is_retried_with_backoff_across_restarts(brain: Brain, webhook: Webhook) -> None:
    """A failed send stays in .ambient/outbox/ and is retried with capped exponential backoff, across restarts; the
    escalation stays answerable meanwhile and is delivered once the endpoint is back."""
    webhook.fail_next = 1_000_000
    _notify(brain, webhook.url, extra="  retry_base_s: 0.2\n  retry_cap_s: 0.4\n")
    brain.python_agent("deploy", FAILING)
    _rollout(brain, items=("eu-1", "eu-2"))
    with brain.daemon() as daemon:
        escs = brain.wait_escalation(count=2)
        wait(lambda: [e for e in _outbox(brain) if e["attempts"] >= 3], "three failed attempts of a notification")
        for entry in _outbox(brain):
            if entry.get("last_attempt_at"):
                assert _when(entry["next_at"]) - _when(entry["last_attempt_at"]) <= 0.4 + 0.5, entry
        assert daemon.stop() == 0
    before = {e["id"]: e["attempts"] for e in _outbox(brain)}
    assert before and all(n >= 1 for n in before.values())
    assert webhook.posts == []
    assert {e["id"] for e in brain.escalations()} == {e["id"] for e in escs}
    assert brain.decide(escs[0]["id"], "skip").rc == 0  # answerable while its notification waits

    with brain.daemon():
        wait(
            lambda: any(e["attempts"] > before.get(e["id"], 0) for e in _outbox(brain)),
            "an attempt after the restart that continues the count",
        )
        webhook.fail_next = 0
        wait(lambda: escs[1]["id"] in _refs(webhook.texts()), "the waiting escalation's notification")
        wait(brain.outbox_empty, "the outbox to empty")
    assert _refs(webhook.texts()).count(escs[1]["id"]) == 1


def test_the_default_backoff_starts_at_5_seconds(brain: Brain, webhook: Webhook) -> None:
    """Without settings, a failed send is retried within 5 s (5 s doubling up to 15 min, with jitter)."""
    webhook.fail_next = 1_000_000
    _notify(brain, webhook.url)
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon():
        brain.wait_escalation()
        [entry] = wait(
            lambda: [e for e in _outbox(brain) if e["attempts"] >= 1 and e.get("last_attempt_at")], "a failed attempt"
        )
    delay = _when(entry["next_at"]) - _when(entry["last_attempt_at"])
    # Full jitter: the first delay is drawn in [0, 5 s], so a second attempt may come before the wait looks again;
    # the n-th delay is drawn in [0, 5 s * 2**(n-1)].
    assert 0 <= delay <= 5 * 2 ** (entry["attempts"] - 1) + 0.05, entry
    assert entry["last_error"]


def test_secrets_in_notification_urls_never_show(brain: Brain, webhook: Webhook) -> None:
    """Tokens are masked in logs, errors, records and `ambient status`: a canary password in the URL is in no output
    and no file of the brain, while the notification itself goes through."""
    canary = "Canary7Secret9Xq2Lm"
    url = f"json://ambient:{canary}@{webhook.address}/hook"
    brain.env["AMBIENT_NOTIFY_URLS"] = url
    webhook.fail_next = 2  # errors get logged first
    brain.config("notify:\n  retry_base_s: 0.2\n  retry_cap_s: 0.4\n")
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    outputs = []
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        wait(lambda: esc["id"] in _refs(webhook.texts()), "the escalation's notification")
        daemon.wait_log("notify_failed")
        for args in (
            ("status",),
            ("status", "--json"),
            ("config", "show", "--json"),
            ("escalations", "--all", "--json"),
            ("doctor",),
        ):
            outputs.append(brain.cli(*args).text)
        log = daemon.log_path.read_text()
    webhook.fail_next = 1
    outputs.append(brain.cli("notify", "test").text)
    outputs.append(brain.cli("notify", "test").text)
    assert any("***" in text or "****" in text for text in outputs)
    for text in [*outputs, log]:
        assert canary not in text, text
    leaked = [str(p) for p in brain.root.rglob("*") if p.is_file() and canary.encode() in p.read_bytes()]
    assert leaked == []


def test_notify_urls_from_the_environment_replace_the_files_and_notify_test_says_which_worked(brain: Brain) -> None:
    """`AMBIENT_NOTIFY_URLS` replaces the file's list; `ambient notify test` sends a test message and says which URL
    worked."""
    with Webhook() as in_file, Webhook() as from_env, Webhook() as broken:
        broken.fail_next = 1_000
        _notify(brain, in_file.url)
        res = brain.cli("notify", "test")
        assert res.rc == 0, res
        assert len(in_file.posts) == 1 and in_file.address in res.out

        res = brain.cli("notify", "test", env={"AMBIENT_NOTIFY_URLS": f"{from_env.url} {broken.url}"})
        assert len(from_env.posts) == 1 and len(in_file.posts) == 1
        ok_line = next(line for line in res.out.splitlines() if from_env.address in line)
        bad_line = next(line for line in res.out.splitlines() if broken.address in line)
        assert ok_line.lower().startswith("ok"), res
        assert bad_line.lower().startswith("fail"), res
        assert res.rc != 0, res


# ---------------------------------------------------------------- answering from Telegram (a fake Bot API)

CHAT = 4242


@pytest.fixture
def bot() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:
        yield fake


def _telegram_brain(brain: Brain, bot: FakeTelegram, tmp_path: Path, user_ids: str = "") -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "telegram-token").write_text(bot.token + "\n")
    brain.env["CREDENTIALS_DIRECTORY"] = str(creds)
    users = f", user_ids: [{user_ids}]" if user_ids else ""
    brain.config(
        f'telegram: {{answers: true, chat_id: "{CHAT}", api_base: "{bot.api_base}", poll_timeout_s: 1{users}}}\n'
    )


def _message_for(bot: FakeTelegram, esc_id: str) -> tuple[int, dict[str, Any]]:
    def found() -> tuple[int, dict[str, Any]] | None:
        with bot.lock:
            for n, msg in enumerate(bot.messages, start=1):
                if f"Ref: {esc_id}" in str(msg.get("text", "")):
                    return n, msg
        return None

    result: tuple[int, dict[str, Any]] = wait(found, f"the Telegram message of {esc_id}")
    return result


def test_telegram_buttons_decide_and_the_run_resumes(brain: Brain, bot: FakeTelegram, tmp_path: Path) -> None:
    """Each escalation arrives on Telegram with one button per option; a press decides, the run resumes, the message is
    edited to "✅ <option> — chosen by <name>", and a second press is told it was already decided."""
    _telegram_brain(brain, bot, tmp_path)
    brain.python_agent("deploy", FLAKY)
    _rollout(brain)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        message_id, message = _message_for(bot, esc["id"])
        assert str(message["chat_id"]) == str(CHAT)
        buttons = bot.buttons(message)
        assert len(buttons) == len(esc["options"]) == 3
        for button, option in zip(buttons, esc["options"], strict=True):
            assert option["key"] in button["text"]
        bot.press(buttons[0], chat_id=CHAT, name="Ana", message_id=message_id)
        [record] = brain.wait_finished("rollout")
        assert record["outcome"] == "success"
        stored = _all(brain)[esc["id"]]
        assert (stored["decision"], stored["by"], stored["channel"]) == ("retry", "Ana", "telegram")
        wait(lambda: any("✅ retry — chosen by Ana" in text for text in bot.edits()), "the message edited")

        bot.press(buttons[1], chat_id=CHAT, name="Ana", message_id=message_id)
        second = bot.last_query()
        wait(lambda: bot.answers().get(second), "the answer to the second press")
        assert "already decided" in bot.answers()[second][0].lower()
        assert _all(brain)[esc["id"]]["decision"] == "retry"
        # the presser's (stale) view is brought back to the decision as its own press showed it, not replaced
        wait(lambda: len(bot.edits()) == 2, "the stale message brought up to date")
        assert "✅ retry — chosen by Ana" in bot.edits()[-1] and "Already decided" not in bot.edits()[-1]
        log = daemon.log_path.read_text()
    assert bot.token not in log
    leaked = [str(p) for p in brain.root.rglob("*") if p.is_file() and bot.token.encode() in p.read_bytes()]
    assert leaked == []
    for args in (("status", "--json"), ("config", "show"), ("doctor",)):
        assert bot.token not in brain.cli(*args).text


def test_telegram_a_press_after_a_cli_answer_is_told_it_was_decided(
    brain: Brain, bot: FakeTelegram, tmp_path: Path
) -> None:
    """A press on an escalation answered from the CLI changes nothing and is told it was already decided."""
    _telegram_brain(brain, bot, tmp_path)
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon():
        [esc] = brain.wait_escalation()
        message_id, message = _message_for(bot, esc["id"])
        assert brain.decide(esc["id"], "skip").rc == 0
        bot.press(bot.buttons(message)[0], chat_id=CHAT, message_id=message_id)
        query = bot.last_query()
        wait(lambda: bot.answers().get(query), "the answer to the press")
        assert "already decided" in bot.answers()[query][0].lower()
        assert _all(brain)[esc["id"]]["decision"] == "skip"


def test_telegram_forged_and_stale_buttons_do_nothing(brain: Brain, bot: FakeTelegram, tmp_path: Path) -> None:
    """Each button carries an unguessable token tied to its escalation: a forged button, or a stale one from an earlier
    escalation, does nothing."""
    _telegram_brain(brain, bot, tmp_path)
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon():
        [first] = brain.wait_escalation()
        first_id, first_msg = _message_for(bot, first["id"])
        assert brain.decide(first["id"], "retry").rc == 0
        [second] = brain.wait_escalation("the second failure's escalation", where=lambda e: e["id"] != first["id"])
        second_id, second_msg = _message_for(bot, second["id"])
        real = bot.buttons(second_msg)[2]  # abort
        esc_part, index, nonce = real["callback_data"].split(":")
        forged_nonce = ("A" if nonce[0] != "A" else "B") + nonce[1:]
        presses = [
            {"callback_data": f"{esc_part}:{index}:{forged_nonce}"},  # forged token
            {"callback_data": f"{esc_part}:{index}"},  # no token
            {"callback_data": f"esc-zzzzzz:{index}:{nonce}"},  # another escalation's name
            {"callback_data": bot.buttons(first_msg)[1]["callback_data"].replace(first["id"], second["id"])},
            bot.buttons(first_msg)[1],  # stale: the first one's skip
        ]
        for press in presses:
            bot.press(press, chat_id=CHAT, message_id=second_id)
        last = bot.last_query()
        wait(lambda: bot.answers().get(last), "the answers to the five presses")
        assert [e["id"] for e in brain.escalations()] == [second["id"]]
        assert _all(brain)[first["id"]]["decision"] == "retry"
        bot.press(bot.buttons(second_msg)[1], chat_id=CHAT, message_id=second_id)  # the real skip button
        [record] = brain.wait_finished("rollout")
    assert _all(brain)[second["id"]]["decision"] == "skip"
    assert record["outcome"] != "aborted"
    assert first_id != second_id


def test_telegram_presses_from_another_chat_or_user_are_ignored(
    brain: Brain, bot: FakeTelegram, tmp_path: Path
) -> None:
    """Presses count only from the configured chat, and from the users in `user_ids` when set."""
    _telegram_brain(brain, bot, tmp_path, user_ids="7")
    brain.python_agent("deploy", FLAKY)
    _rollout(brain)
    with brain.daemon():
        [esc] = brain.wait_escalation()
        message_id, message = _message_for(bot, esc["id"])
        abort, retry = bot.buttons(message)[2], bot.buttons(message)[0]
        bot.press(abort, chat_id=999, user_id=7, message_id=message_id)
        bot.press(abort, chat_id=CHAT, user_id=8, name="Eve", message_id=message_id)
        bot.press(retry, chat_id=CHAT, user_id=7, name="Ana", message_id=message_id)
        [record] = brain.wait_finished("rollout")
    stored = _all(brain)[esc["id"]]
    assert (stored["decision"], stored["by"]) == ("retry", "Ana")
    assert record["outcome"] == "success"


@pytest.mark.slow
def test_telegram_a_press_is_neither_lost_nor_applied_twice_across_restarts(
    brain: Brain, bot: FakeTelegram, tmp_path: Path
) -> None:
    """The update offset is persisted before acting: a press made while the daemon is down is applied when it comes
    back, and a restart does not apply (or answer) a press twice."""
    _telegram_brain(brain, bot, tmp_path)
    brain.python_agent("deploy", FLAKY)
    _rollout(brain)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        message_id, message = _message_for(bot, esc["id"])
        assert daemon.stop() == 0
    bot.press(bot.buttons(message)[0], chat_id=CHAT, message_id=message_id)
    query = bot.last_query()
    with brain.daemon() as daemon:
        [record] = brain.wait_finished("rollout")
        wait(lambda: bot.answers().get(query), "the answer to the press")
        assert daemon.stop() == 0
    with brain.daemon():
        with bot.lock:
            polls = len([c for c in bot.calls if c[0] == "getUpdates"])
        wait(lambda: len([c for c in bot.calls if c[0] == "getUpdates"]) > polls + 1, "the restarted daemon to poll")
    assert record["outcome"] == "success"
    assert len(bot.answers()[query]) == 1, bot.answers()
    assert len(brain.finished("rollout")) == 1


def test_agent_text_is_sent_as_plain_text_within_telegrams_4096_characters(
    brain: Brain, bot: FakeTelegram, tmp_path: Path
) -> None:
    """Agent text is sent as plain text (never HTML) and cut to Telegram's 4096 characters."""
    _telegram_brain(brain, bot, tmp_path)
    brain.python_agent(
        "asker",
        """
        import json, sys
        json.load(sys.stdin)
        question = "<b>Deploy</b> & <a href='https://example.invalid'>roll back</a>? " + "detail " * 270
        print(json.dumps({"signal": "ESCALATE", "question": question,
                          "options": [f"<i>plan-{n}</i> " + "o" * 150 for n in range(16)]}))
    """,
    )
    _rollout(brain, name="ask", agent="asker", items=("x",))
    with brain.daemon():
        [esc] = brain.wait_escalation()
        _, message = _message_for(bot, esc["id"])
    text = str(message["text"])
    assert len(text) <= 4096
    assert message.get("parse_mode") in (None, ""), message.get("parse_mode")
    assert "<b>Deploy</b> & <a href='https://example.invalid'>" in text
    assert "&amp;" not in text and "&lt;" not in text


# ---------------------------------------------------------------- an ESCALATE handed to the daemon


def test_an_escalate_sent_with_ambient_send_becomes_an_escalation(brain: Brain, tmp_path: Path) -> None:
    """Every ESCALATE becomes an escalation file, also one an agent hands to the daemon with `ambient send`."""
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    brain.python_agent(
        "asker",
        """
        import json, subprocess, sys
        json.load(sys.stdin)
        packet = {"from": "asker", "to": "human", "signal": "ESCALATE",
                  "payload": {"options": ["wait", "go"], "context": {"question": "The disk is 95% full: go on?"}}}
        res = subprocess.run([sys.executable, "-m", "ambient", "send", "-"], input=json.dumps(packet), text=True,
                             capture_output=True)
        print(json.dumps({"status": "ok" if res.returncode == 0 else "failed"}))
    """,
        runner={"env": env},
    )
    _rollout(brain, name="ask", agent="asker", items=("x",))
    with brain.daemon():
        [record] = brain.wait_finished("ask")
        assert record["outcome"] == "success"  # the packet was delivered
        wait(lambda: not list((brain.root / ".ambient" / "inbox").glob("*.json")), "the inbox to be read")
        [esc] = brain.wait_escalation("the agent's question", timeout=5)
    assert esc["question"] == "The disk is 95% full: go on?"


# ---------------- what reaches the person's phone, and only what still needs them

FAILING_AGENT = """
    import sys
    sys.exit(1)
"""


def _failing_run(brain: Brain, name: str, items: list[str], extra: str = "") -> None:
    brain.python_agent("broken", FAILING_AGENT)
    brain.workflow(
        name,
        f"""
workflow: {name}
for_each:
  items: {items}
  spawn: broken
  scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
{extra}""",
    )


def test_a_digest_batches_results_and_goes_out_while_the_daemon_runs(brain: Brain, webhook: Webhook) -> None:
    """`notify.digest`: finished runs are not sent one by one but as one message every `digest_hours`, sent while
    the daemon runs (it waited in the outbox for the next escalation or start)."""
    brain.config(
        f"""
        tick_seconds: 0.2
        notify:
          urls: ["{webhook.url}"]
          results: all
          digest: true
          digest_hours: 0.001
        """
    )
    brain.python_agent("fine", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n")
    brain.workflow(
        "tidy", "workflow: tidy\nfor_each:\n  items: [a]\n  spawn: fine\n  scope: {zone: project, files: [w/a.md]}\n"
    )
    with brain.daemon():
        brain.wait_finished("tidy")
        [digest] = wait(lambda: [t for t in webhook.texts() if t.startswith("ambient digest")], "the digest")
    assert digest.startswith("ambient digest of the last 3.6 s: 1 update(s)"), digest
    assert "tidy" in digest, digest
    assert not [t for t in webhook.texts() if t.startswith("tidy")], webhook.texts()  # never sent on its own


def test_remind_before_sends_a_reminder_before_the_deadline(brain: Brain, webhook: Webhook) -> None:
    """`on_escalate: {timeout, remind_before}` sends a reminder that long before the deadline."""
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n')
    _failing_run(brain, "nightly", ["db"], extra="on_escalate: {timeout: 8s, remind_before: 6s, on_timeout: abort}\n")
    with brain.daemon():
        [esc] = brain.wait_escalation()
        assert esc["remind_at"] is not None and esc["deadline"] is not None, esc
        reminder = wait(lambda: [t for t in webhook.texts() if t.startswith("Reminder")], "the reminder at the webhook")
        assert f"Ref: {esc['id']}" in reminder[0]
        assert brain.escalations()[0]["reminded"] is True
    first = [t for t in webhook.texts() if t.startswith("Decision needed") and esc["id"] in t]
    assert len(first) == 1, webhook.texts()


def test_an_escalation_answered_while_its_message_waits_is_never_sent(brain: Brain, webhook: Webhook) -> None:
    """A "Decision needed" still in the outbox when the person answers is dropped, not delivered."""
    webhook.fail_next = 10_000
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n  retry_base_s: 0.2\n  retry_cap_s: 0.4\n')
    _failing_run(brain, "deploy", ["web"])
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        daemon.wait_log("notification_retry")  # the phone is out of reach: the message waits in the outbox
        assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("deploy")
        webhook.fail_next = 0
        wait(brain.outbox_empty, "the outbox to empty")
    assert not any(f"Ref: {esc['id']}" in t for t in webhook.texts()), webhook.texts()


def test_a_new_url_receives_only_what_is_pending_now(brain: Brain, webhook: Webhook) -> None:
    """A URL added to a brain that ran without one gets the escalations still pending, nothing else."""
    _failing_run(brain, "old", ["a", "b", "c"])
    brain.until_idle()
    escs = {e["item"]: e for e in brain.escalations()}
    assert brain.decide(escs["a"]["id"], "skip").rc == 0
    assert brain.decide(escs["b"]["id"], "skip").rc == 0
    brain.until_idle()
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n')
    with brain.daemon():
        wait(lambda: any(f"Ref: {escs['c']['id']}" in t for t in webhook.texts()), "the pending escalation")
        wait(brain.outbox_empty, "the outbox to empty")
    sent = webhook.texts()
    assert len(sent) == 1, sent
    assert all(f"Ref: {escs[k]['id']}" not in sent[0] for k in ("a", "b"))


def test_notify_test_covers_the_telegram_answers_bot(
    brain: Brain, webhook: Webhook, telegram: FakeTelegram, tmp_path: Path
) -> None:
    """`ambient notify test` sends through every channel the daemon uses: the URLs and the Telegram answers bot."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text(telegram.token)
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
        telegram: {{answers: true, chat_id: "4242", api_base: "{telegram.api_base}"}}
    """)
    res = brain.cli("notify", "test", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert res.rc == 0, res
    assert "2 of 2" in res.out, res
    assert "telegram" in res.out and "4242" in res.out, res
    assert [str(m["chat_id"]) for m in telegram.messages] == ["4242"]
    assert len(webhook.posts) == 1
    assert telegram.token not in res.text


def test_notify_test_says_when_the_telegram_bot_cannot_be_reached(brain: Brain, tmp_path: Path) -> None:
    """`ambient notify test` reports a Telegram answers bot it cannot reach as a failure (exit 1), token masked."""
    creds = tmp_path / "creds"
    creds.mkdir()
    token = "123456789:AAH-unreachableToken_abcdefghijklmnop"
    (creds / "telegram-token").write_text(token)
    brain.config('telegram: {answers: true, chat_id: "4242", api_base: "http://127.0.0.1:9"}\n')
    res = brain.cli("notify", "test", "--timeout", "5", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert res.rc == 1, res
    assert "FAIL" in res.out and "telegram" in res.out, res
    assert token not in res.text


def test_a_malformed_bot_token_fails_its_channel_only_and_doctor_says_so(
    brain: Brain, webhook: Webhook, tmp_path: Path
) -> None:
    """A bot token that cannot be one (the placeholder of examples/systemd) fails the Telegram channel with the rule
    it breaks; `notify test` still tries the URLs; `doctor` reports it instead of Telegram staying silently off."""
    token = tmp_path / "telegram-token"
    token.write_text("123456:ABC-your-bot-token\n")
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
        telegram: {{answers: true, chat_id: "4242", token_file: "{token}"}}
    """)
    res = brain.cli("notify", "test")
    assert res.rc == 1, res
    assert re.search(r"^ok +json://", res.out, re.M) and len(webhook.posts) == 1, res
    assert "FAIL  the Telegram bot token is malformed" in res.out and "20 or more" in res.out, res
    assert "1 of 2 notification channel(s) worked" in res.out, res
    doctor = brain.cli("doctor")
    assert "telegram.answers is on but the Telegram bot token is malformed" in doctor.text, doctor
    assert "ABC-your-bot-token" not in res.text + doctor.text


def test_doctor_counts_no_message_about_an_answered_escalation_as_waiting(brain: Brain) -> None:
    """The demo's path: an item fails and waits on the person (its message queued), the person answers with the
    daemon down, `run --until-idle` finishes. `ambient doctor` then had the daemon down as an error, "waiting on
    it: 2 notification(s) to send", for messages that will never be sent: an answered escalation's is dropped."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    alone = brain.cli("doctor").out  # no channel configured: the message waits on a URL, not on the daemon
    assert "notification(s) to send" not in alone and "no notification URL is configured" in alone, alone
    settings = brain.read("profil/ambient.yml")
    brain.write("profil/ambient.yml", settings + "\nnotify:\n  urls: ['json://127.0.0.1:9/hook']\n")
    assert "notification(s) to send" in brain.cli("doctor").out  # its message does wait on the daemon now
    brain.write("profil/ambient.yml", settings)
    brain.ok("decide", esc["id"], "skip")
    brain.until_idle()
    res = brain.cli("doctor")
    assert "notification(s) to send" not in res.out, res.out
    assert res.rc == 0, res.out


# ---------------------------------------------------------------- channels: reloads, what the checks say


def _token_file_brain(brain: Brain, bot: FakeTelegram, hook: Webhook, token_file: Path, poll: int = 1) -> None:
    brain.config(
        f'notify: {{urls: ["{hook.url}"]}}\n'
        f'telegram: {{answers: true, chat_id: "{CHAT}", api_base: "{bot.api_base}", poll_timeout_s: {poll}, '
        f'token_file: "{token_file}"}}\n'
    )


def _sent_for(bot: FakeTelegram, esc_id: str) -> list[str]:
    return [text for text in bot.sent_texts() if f"Ref: {esc_id}" in text]


def test_a_reload_reads_a_fixed_token_file_and_telegram_gets_the_question_waiting(
    brain: Brain, bot: FakeTelegram, webhook: Webhook, tmp_path: Path
) -> None:
    """A bot token the Bot API refuses: the webhook gets the question, Telegram answers stay off. With the token file
    fixed but no reload yet, `ambient doctor` and `ambient notify test` ask the daemon and say Telegram is off and why
    (exit 1), not "ok". SIGHUP: the reload names the changed token (never its value), Telegram answers come up, and
    the question already waiting arrives on Telegram with its buttons, once, even after another reload."""
    wrong = "123456789:AAH-refusedToken_abcdefghijklmnopq"
    token_file = tmp_path / "bot-token"
    token_file.write_text(wrong + "\n")
    _token_file_brain(brain, bot, webhook, token_file)
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        wait(lambda: any(f"Ref: {esc['id']}" in t for t in webhook.texts()), "the question on the webhook")
        daemon.wait_log("telegram_poll_failed")  # the Bot API refused the token
        assert _sent_for(bot, esc["id"]) == []

        token_file.write_text(bot.token + "\n")  # fixed, not reloaded yet: the daemon still has the refused one
        doctor = brain.cli("doctor")
        assert doctor.rc == 1, doctor
        assert re.search(r"telegram.*off.*401", doctor.text, re.IGNORECASE), doctor
        assert "nothing wrong found" not in doctor.text
        test = brain.cli("notify", "test")
        assert test.rc == 1, test
        assert re.search(r"daemon.*telegram.*off.*401", test.text, re.IGNORECASE), test
        off = daemon.logged("channel_off", channel="telegram")
        assert off and all("401" in line["why"] for line in off), off

        daemon.signal(signal.SIGHUP)
        [reloaded] = daemon.wait_log("reloaded", trigger="sighup")
        assert "telegram.token_file" in str(reloaded["settings_changed"]), reloaded
        daemon.wait_log("channel_up", channel="telegram")
        message_id, message = _message_for(bot, esc["id"])
        assert len(bot.buttons(message)) == len(esc["options"]) == 3
        doctor = brain.cli("doctor")
        assert doctor.rc == 0, doctor
        assert re.search(r"telegram.*\bup\b", doctor.text, re.IGNORECASE), doctor

        # another reload that restarts the bot (a setting of its own changed): nothing is sent twice
        _token_file_brain(brain, bot, webhook, token_file, poll=2)
        daemon.wait_log("channel_up", channel="telegram", count=2)
        daemon.wait_log("channel_caught_up", channel="telegram", count=2)
        wait(brain.outbox_empty, "the outbox empty")
        assert len(_sent_for(bot, esc["id"])) == 1, bot.sent_texts()
        assert sum(f"Ref: {esc['id']}" in t for t in webhook.texts()) == 1

        bot.press(bot.buttons(message)[2], chat_id=CHAT, name="Ana", message_id=message_id)  # 3. abort
        wait(lambda: _all(brain)[esc["id"]].get("channel") == "telegram", "the press recorded")
        log = daemon.log_path.read_text()
    assert bot.token not in log and wrong not in log


def test_a_bot_that_comes_up_at_start_gets_the_questions_waiting_once(
    brain: Brain, bot: FakeTelegram, webhook: Webhook, tmp_path: Path
) -> None:
    """A question told to the webhook while the bot token file could not be read reaches Telegram, with its buttons,
    when the daemon starts again with the file there; the webhook is not told twice, and a third start sends nothing
    more."""
    token_file = tmp_path / "bot-token"
    _token_file_brain(brain, bot, webhook, token_file)  # not there yet
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        wait(lambda: any(f"Ref: {esc['id']}" in t for t in webhook.texts()), "the question on the webhook")
        wait(brain.outbox_empty, "the outbox empty")  # the webhook had it: nothing left to send
        assert daemon.stop() == 0
    token_file.write_text(bot.token + "\n")
    with brain.daemon() as daemon:
        _, message = _message_for(bot, esc["id"])
        assert len(bot.buttons(message)) == 3
        daemon.wait_log("channel_caught_up", channel="telegram", queued=1)
        wait(brain.outbox_empty, "the outbox empty")
        assert daemon.stop() == 0
    with brain.daemon() as daemon:
        daemon.wait_log("channel_caught_up", channel="telegram", queued=0)
        assert daemon.stop() == 0
    assert len(_sent_for(bot, esc["id"])) == 1, bot.sent_texts()
    assert sum(f"Ref: {esc['id']}" in t for t in webhook.texts()) == 1


def test_without_a_daemon_the_checks_say_so_and_read_the_configuration_alone(
    brain: Brain, bot: FakeTelegram, webhook: Webhook, tmp_path: Path
) -> None:
    """No daemon: `ambient doctor` and `ambient notify test` say none runs, and judge the token file themselves."""
    _token_file_brain(brain, bot, webhook, tmp_path / "no-such-token")
    doctor = brain.cli("doctor")
    assert doctor.rc == 1, doctor
    assert "daemon is down" in doctor.text
    assert re.search(r"token_file .*no-such-token.* cannot be read", doctor.text), doctor
    test = brain.cli("notify", "test")
    assert test.rc == 1, test
    assert "no daemon runs" in test.text and "configuration alone" in test.text, test
    assert any("test notification" in t for t in webhook.texts())


def test_status_points_to_the_notifications_section_that_exists(brain: Brain) -> None:
    """With nobody to tell, `ambient status` names the page and section of the docs where notifications are set up."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain)
    brain.until_idle()
    text = brain.ok("status").out
    found = re.search(r"see (docs/[\w.-]+\.md)#([\w-]+)", text)
    assert found, text
    page = Path(__file__).parents[2] / found.group(1)
    anchors = {
        re.sub(r"[^\w -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    }
    assert found.group(2) in anchors, (found.group(2), sorted(anchors))


def test_a_url_the_daemon_never_sent_to_is_not_said_up_and_one_that_failed_is_off(brain: Brain) -> None:
    """A notification URL nobody listens on, loaded by the running daemon: `doctor` says it is not tried yet (never
    "up"), and once the question's message fails there, says it is off (exit 1) and why."""
    with socket.socket() as s:  # a loopback port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        dead = f"json://127.0.0.1:{s.getsockname()[1]}/hook"
    brain.config(f'notify:\n  urls: ["{dead}"]\n')
    brain.python_agent("deploy", FAILING)
    with brain.daemon():
        wait(lambda: "json://" in brain.cli("doctor").out, "the daemon to say how its channels are")
        before = brain.cli("doctor")
        assert "is not tried yet" in before.out and "is up" not in before.out, before
        _rollout(brain)
        brain.wait_escalation()
        wait(lambda: brain.cli("doctor").rc == 1, "the failed message to turn the channel off")
        after = brain.cli("doctor")
    assert "is off: the last message failed" in after.out, after


def test_decide_says_when_the_answer_waits_for_the_daemon(brain: Brain) -> None:
    """An answer given while no daemon runs is kept and applied at its start: `decide` says so (a new user saw the
    run still waiting on them in `status` and took the answer for lost); with the daemon up it says nothing of it."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain, items=("eu-1", "eu-2"))
    brain.until_idle()
    first, second = brain.escalations()
    down = brain.decide(first["id"], "skip")
    assert down.rc == 0 and "The daemon is down: the run goes on with this answer when it starts" in down.out, down
    with brain.daemon():
        up = brain.decide(second["id"], "skip")
    assert up.rc == 0 and "daemon is down" not in up.out, up


def test_decide_exits_3_when_its_run_was_aborted_before_the_answer(brain: Brain) -> None:
    """`decide` exits 3 when the question's run ended before the answer: here the run was aborted through its claim
    (`ambient gate abort`) while no daemon ran, and the answer came next. Nothing applies it: the question is
    closed saying why (`ambient escalations --all`), and the run ends `aborted` when the daemon starts."""
    brain.python_agent("deploy", FAILING)
    _rollout(brain, items=("eu-1",))
    brain.until_idle()
    [esc] = brain.escalations()
    [run] = brain.status()["runs"]
    brain.ok("gate", "abort", run["run_id"], "the release was called off")
    late = brain.decide(esc["id"], "retry")
    assert late.rc == 3, late
    assert "was not applied" in late.err and "the release was called off" in late.err, late
    assert "answer_not_applied" not in late.err, late  # said once, to the person, not as a log line too
    closed = _all(brain)[esc["id"]]
    assert closed["status"] == "cancelled" and "the release was called off" in closed["note"], closed
    assert brain.escalations() == []
    brain.until_idle()
    [record] = brain.finished("rollout")
    assert record["outcome"] == "aborted", record
    steps = [(s["item"], s["attempt"]) for s in record["steps"]]
    assert steps == [("eu-1", 1)], record  # the answer was never applied: eu-1 did not run again
