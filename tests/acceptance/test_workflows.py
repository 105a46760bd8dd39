"""README, "Workflows": for_each and chain runs as a person drives them, from the drop of a file to the answer."""

from __future__ import annotations

import json

import yaml

from tests.acceptance.harness import Brain, Webhook, wait

# An agent that asks the person which colour, then paints with the answer it is handed back.
COLOUR_AGENT = """
    import json, os, pathlib, sys
    packet = json.load(sys.stdin)
    ctx = packet["payload"]["context"]
    if "decision" not in ctx:
        print(json.dumps({"signal": "ESCALATE", "options": ["blue", "green"], "question": "Which colour?"}))
        sys.exit(0)
    target = pathlib.Path(os.environ["AMBIENT_BRAIN"], packet["scope"]["files"][0])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(ctx["decision"] + "\\n")
    print(json.dumps({"status": "ok", "colour": ctx["decision"]}))
"""


def test_an_agents_escalate_in_a_for_each_resumes_with_the_decision(brain: Brain) -> None:
    """Issue 23.1: the agent asks, the person answers with `ambient decide`, the agent runs again with the answer
    in payload.context.decision and the run finishes."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.workflow("paint", """
        workflow: paint
        for_each:
          items: [wall, door]
          spawn: colour
          scope: {zone: project, files: ["workspace/paint/{{item}}.md"]}
    """)
    with brain.daemon():
        escs = brain.wait_escalation("the agent's two questions", count=2)
        assert {e["question"] for e in escs} == {"Which colour?"}
        assert [o["key"] for o in escs[0]["options"]][:2] == ["blue", "green"]
        by_item = {e["item"]: e for e in escs}
        assert brain.decide(by_item["wall"]["id"], "green").rc == 0
        assert brain.decide(by_item["door"]["id"], "1").rc == 0  # by number: blue
        record = brain.wait_finished("paint")[0]
    assert record["outcome"] == "success", record
    assert brain.read("workspace/paint/wall.md") == "green\n"
    assert brain.read("workspace/paint/door.md") == "blue\n"
    assert brain.escalations() == []
    assert "paint" not in {r["workflow"] for r in brain.status()["runs"]}


def test_until_idle_resumes_an_answered_escalation(brain: Brain) -> None:
    """Issue 23.1, the other way a person runs it: `run --until-idle`, decide, `run --until-idle` again."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.workflow("paint", """
        workflow: paint
        for_each:
          items: [wall]
          spawn: colour
          scope: {zone: project, files: ["workspace/paint/{{item}}.md"]}
    """)
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "blue").rc == 0
    brain.until_idle()
    [record] = brain.finished("paint")
    assert record["outcome"] == "success"
    assert brain.read("workspace/paint/wall.md") == "blue\n"


def test_a_chain_steps_escalate_shows_its_question_and_options_and_hands_back_the_answer(brain: Brain) -> None:
    """Issue 23.2: a chain step's ESCALATE reaches the person as the agent's question with its own options."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.python_agent("finisher", """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"status": "ok"}))
    """)
    brain.workflow("decorate", """
        name: decorate
        chain:
          - {step: 1, type: brain-write, scope: workspace/paint/hall.md, agents: [colour]}
          - {step: 2, type: brain-write, scope: workspace/paint/done.md, agents: [finisher]}
    """)
    with brain.daemon():
        [esc] = brain.wait_escalation("the step's question")
        assert esc["question"] == "Which colour?", esc
        assert esc["kind"] == "question"
        keys = [o["key"] for o in esc["options"]]
        assert keys[:2] == ["blue", "green"], keys
        assert "no detail" not in esc["question"]
        assert brain.decide(esc["id"], "green").rc == 0
        [record] = brain.wait_finished("decorate")
    assert record["outcome"] == "success", record
    assert brain.read("workspace/paint/hall.md") == "green\n"


FAILING_AGENT = """
    import sys
    print("the instance is down", file=sys.stderr)
    sys.exit(1)
"""


def _claim_statuses(brain: Brain, run_id: str) -> dict[str, str]:
    out = {}
    for path in (brain.root / "claims").glob(f"{run_id}-item-*.yml"):
        out[path.stem] = yaml.safe_load(path.read_text())["status"]
    return out


def test_abort_on_one_item_cancels_its_siblings_escalations(brain: Brain, webhook: Webhook) -> None:
    """Issue 23.3: `abort` cascades: the other items' escalations are closed as cancelled (answering one says so,
    exit 1), their claims leave waiting_human, and nothing more about them is notified."""
    webhook.fail_next = 10_000  # the phone is out of reach: every "Decision needed" waits in the outbox
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
          retry_base_s: 0.2
          retry_cap_s: 0.5
    """)
    brain.python_agent("deploy", FAILING_AGENT)
    brain.workflow("rollout", """
        workflow: rollout
        for_each:
          items: [eu-1, eu-2, eu-3]
          spawn: deploy
          concurrency: 3
          scope: {zone: project, files: ["infrastructure/{{item}}.yml"]}
    """)
    with brain.daemon():
        escs = brain.wait_escalation("three failed items", count=3)
        run_id = escs[0]["run_id"]
        first, *siblings = sorted(escs, key=lambda e: e["item"])
        assert brain.decide(first["id"], "abort").rc == 0
        [record] = brain.wait_finished("rollout")
        assert record["outcome"] == "aborted"
        wait(lambda: brain.escalations() == [], "the siblings' escalations to close")
        settled = {e["id"]: e for e in brain.escalations(all=True)}
        for sib in siblings:
            assert settled[sib["id"]]["status"] == "cancelled", settled[sib["id"]]
            late = brain.decide(sib["id"], "retry")
            assert late.rc == 1, late
            assert "cancelled" in late.err, late
        wait(lambda: "waiting_human" not in _claim_statuses(brain, run_id).values(),
             "the item claims to leave waiting_human")
        webhook.fail_next = 0  # the phone is back: only what is still pending may reach it
        wait(brain.outbox_empty, "the queued notifications to be sent or dropped")
    sent = "\n".join(webhook.texts())
    for sib in siblings:
        assert f"Ref: {sib['id']}" not in sent, sent
    assert all(status != "waiting_human" for status in _claim_statuses(brain, run_id).values())
    assert json.dumps(brain.status()["escalations"]) == "[]"
