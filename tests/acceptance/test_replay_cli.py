"""README, "The learning loop": `ambient replay` over an unchanged workflow says what its runs met (issue 23.11)."""

from __future__ import annotations

import json
import re

from tests.acceptance.harness import Brain, for_each

# Crashes on its first attempt of each item (the retry policy runs it again), succeeds after.
FLAKY_AGENT = """
    import json, os, sys
    json.load(sys.stdin)
    if os.environ["AMBIENT_ATTEMPT"] == "1":
        sys.exit(3)
    print(json.dumps({"status": "ok"}))
"""

# A code step without tests (the person confirms it), then a deploy behind a human gate.
STEP_AGENT = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""


def _counts(text: str) -> tuple[int, int]:
    found = re.search(r"escalations: (\d+) recorded -> (\d+) now", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def test_replay_of_an_unchanged_for_each_counts_retries_as_retries(brain: Brain) -> None:
    """A run whose errors were retried by its `retry:` policy escalated nothing; replay says 0 -> 0."""
    brain.python_agent("flaky", FLAKY_AGENT)
    brain.workflow(
        "sync",
        """
        workflow: sync
        for_each:
          items: [a, b, c]
          spawn: flaky
        retry: {attempts: 3, backoff: 10ms, max_backoff: 20ms, on: [error]}
    """,
    )
    brain.until_idle()
    [record] = brain.finished("sync")
    assert record["outcome"] == "success" and record["escalations"] == 0
    res = brain.ok("replay", "sync")
    assert _counts(res.out) == (0, 0), res
    assert "0 step(s) routed differently" in res.out


def test_replay_of_an_unchanged_chain_counts_its_gates_and_close_tiers(brain: Brain) -> None:
    """A chain's human gate and a code step closed without tests reach the person; replay counts both."""
    brain.python_agent("worker", STEP_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: code, scope: projets/app/, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    for _ in range(2):  # the close tier of step 1, then the gate of step 2
        [esc] = brain.escalations()
        assert brain.decide(esc["id"], "approve").rc == 0
        brain.until_idle()
    [record] = brain.finished("ship")
    assert record["outcome"] == "success" and record["escalations"] == 2
    assert _counts(brain.ok("replay", "ship").out) == (2, 2)
    data = json.loads(brain.ok("replay", "ship", "--json").out)
    assert (data["would_escalate"], data["routed_differently"]) == (2, 0)


def test_replay_says_what_a_changed_workflow_would_do(brain: Brain) -> None:
    """Removing the gate: replay reports one escalation fewer for the same recorded run."""
    brain.python_agent("worker", STEP_AGENT)
    gated = """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """
    brain.workflow("ship", gated)
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "approve").rc == 0
    brain.until_idle()
    assert _counts(brain.ok("replay", "ship").out) == (1, 1)
    brain.workflow("ship", gated.replace(", gate: human", ""))
    assert _counts(brain.ok("replay", "ship").out) == (1, 0)


ASKING_AGENT = """
    import json, os, sys
    packet = json.load(sys.stdin)
    decision = packet["payload"].get("context", {}).get("decision")
    if decision is None:
        print(json.dumps({"signal": "ESCALATE", "options": ["blue", "green"],
                          "question": "Which colour for " + os.environ["AMBIENT_ITEM"] + "?"}))
    else:
        print(json.dumps({"status": "ok"}))
"""


def test_replay_lists_each_question_with_its_words_and_why_it_reaches_you(brain: Brain) -> None:
    """An agent's question is listed as its question, with its words; a failure as failed, with the agent's."""
    brain.python_agent("painter", ASKING_AGENT)
    brain.shell_agent("deny", 'cat > /dev/null\necho "quota exceeded" >&2\nexit 1\n')
    brain.workflow("paint", for_each("paint", "painter", ["door-7"]))
    brain.workflow("quota", for_each("quota", "deny", ["eu-1"]))
    brain.until_idle()
    for esc in brain.escalations():
        assert brain.decide(esc["id"], "green" if esc["workflow"] == "paint" else "skip").rc == 0
    brain.until_idle()
    paint = brain.ok("replay", "paint").out
    assert re.search(r"door-7 \(painter, its question\): Which colour for door-<n>\?", paint), paint
    quota = brain.ok("replay", "quota").out
    assert re.search(r"eu-1 \(deny, failed\): agent exited with code <n>: quota exceeded", quota), quota
    [item] = json.loads(brain.ok("replay", "paint", "--json").out)["items"]
    assert (item["kind"], item["change"]) == ("question", "escalate"), item


def test_replay_lists_a_gate_that_stopped_a_run_before_its_step(brain: Brain) -> None:
    """A human gate rejected before its step ran counts, and is listed, like every escalation replay counts."""
    brain.python_agent("worker", STEP_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "reject").rc == 0
    brain.until_idle()
    out = brain.ok("replay", "ship").out
    assert _counts(out) == (1, 1), out
    assert "Would be escalated to you (1)" in out, out
    # the rule your answer made is the one the live gate would meet (one rule of situations): it suggests reject
    assert re.search(r" 2 \(worker, human gate\); rule r-\w+ suggests 'reject'$", out, re.M), out


def test_stats_counts_each_escalation_for_the_agent_it_names(brain: Brain) -> None:
    """Issue 23.14: an escalation counts for its workflow and for the agent named in it (a failure, a gate)."""
    brain.python_agent("failer", "import sys\nsys.exit(1)\n")
    brain.python_agent("worker", STEP_AGENT)
    brain.workflow("fails", "workflow: fails\nfor_each: {items: [a], spawn: failer}\n")
    brain.workflow(
        "gated",
        """
        name: gated
        chain:
          - {step: 1, type: deploy, scope: infrastructure/x/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    for esc in brain.escalations():
        assert brain.decide(esc["id"], "abort" if esc["workflow"] == "fails" else "reject").rc == 0
    brain.until_idle()
    data = json.loads(brain.ok("stats", "--json").out)
    agents = {a["agent"]: a for a in data["agents"]}
    assert agents["failer"]["escalations"] == 1, agents
    assert agents["worker"]["escalations"] == 1, agents  # asked about before it ran: the gate was rejected
    workflows = {w["workflow"]: w for w in data["workflows"]}
    assert workflows["fails"]["escalations"] == 1 and workflows["gated"]["escalations"] == 1
    only = json.loads(brain.ok("stats", "--agent", "worker", "--json").out)
    assert [a["agent"] for a in only["agents"]] == ["worker"] and only["agents"][0]["escalations"] == 1
