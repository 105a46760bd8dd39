"""docs/workflows.md: for_each and chain runs as a person drives them, from the drop of a file to the answer."""

from __future__ import annotations

import json
import os
import re

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


FOR_EACH = """workflow: {name}
for_each:
  items: {items}
  spawn: {agent}
  scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
"""

OK_AGENT = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""

# Fails the items whose name starts with "bad" (a business failure: exit 1), succeeds on the others.
SOME_FAIL_AGENT = """
    import json, os, sys
    json.load(sys.stdin)
    if os.environ["AMBIENT_ITEM"].startswith("bad"):
        sys.exit(1)
    print(json.dumps({"status": "ok"}))
"""

# Keeps every SPAWN packet it is handed, one JSON line each, in workspace/packets.jsonl.
SAVE_PACKET = (
    'packet = json.load(sys.stdin); pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace").mkdir(exist_ok=True); '
    'open(pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace", "packets.jsonl"), "a")'
    '.write(json.dumps(packet) + "\\n")'
)


def test_an_agents_escalate_in_a_for_each_resumes_with_the_decision(brain: Brain) -> None:
    """The agent asks, the person answers with `ambient decide`, the agent runs again with the answer
    in payload.context.decision and the run finishes."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.workflow(
        "paint",
        """
        workflow: paint
        for_each:
          items: [wall, door]
          spawn: colour
          scope: {zone: project, files: ["workspace/paint/{{item}}.md"]}
    """,
    )
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
    """An agent's question answered the other way a person runs it: `run --until-idle`, decide, `run --until-idle`
    again."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.workflow(
        "paint",
        """
        workflow: paint
        for_each:
          items: [wall]
          spawn: colour
          scope: {zone: project, files: ["workspace/paint/{{item}}.md"]}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "blue").rc == 0
    brain.until_idle()
    [record] = brain.finished("paint")
    assert record["outcome"] == "success"
    assert brain.read("workspace/paint/wall.md") == "blue\n"


def test_a_chain_steps_escalate_shows_its_question_and_options_and_hands_back_the_answer(brain: Brain) -> None:
    """A chain step's ESCALATE reaches the person as the agent's question with its own options."""
    brain.python_agent("colour", COLOUR_AGENT)
    brain.python_agent(
        "finisher",
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "decorate",
        """
        name: decorate
        chain:
          - {step: 1, type: brain-write, scope: workspace/paint/hall.md, agents: [colour]}
          - {step: 2, type: brain-write, scope: workspace/paint/done.md, agents: [finisher]}
    """,
    )
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
    """`abort` cascades: the other items' escalations are closed as cancelled (answering one says so,
    exit 1), their claims leave waiting_human, and nothing more about them is notified."""
    webhook.fail_next = 10_000  # the phone is out of reach: every "Decision needed" waits in the outbox
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
          retry_base_s: 0.2
          retry_cap_s: 0.5
    """)
    brain.python_agent("deploy", FAILING_AGENT)
    brain.workflow(
        "rollout",
        """
        workflow: rollout
        for_each:
          items: [eu-1, eu-2, eu-3]
          spawn: deploy
          concurrency: 3
          scope: {zone: project, files: ["infrastructure/{{item}}.yml"]}
    """,
    )
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
        wait(
            lambda: "waiting_human" not in _claim_statuses(brain, run_id).values(),
            "the item claims to leave waiting_human",
        )
        webhook.fail_next = 0  # the phone is back: only what is still pending may reach it
        wait(brain.outbox_empty, "the queued notifications to be sent or dropped")
    sent = "\n".join(webhook.texts())
    for sib in siblings:
        assert f"Ref: {sib['id']}" not in sent, sent
    assert all(status != "waiting_human" for status in _claim_statuses(brain, run_id).values())
    assert json.dumps(brain.status()["escalations"]) == "[]"


CONTEXT_AGENT = """
    import json, os, pathlib, sys
    ctx = json.load(sys.stdin)["payload"]["context"]
    log = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace", "seen.jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.write(json.dumps(ctx, sort_keys=True) + "\\n")
    print(json.dumps({"status": "ok"}))
"""


def _seen(brain: Brain) -> list[dict[str, object]]:
    path = brain.path("workspace/seen.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_start_context_reaches_for_each_items(brain: Brain) -> None:
    """`ambient start W --context JSON` hands the context to every for_each item (the run's context
    wins over the workflow's own for_each.context)."""
    brain.python_agent("reader", CONTEXT_AGENT)
    brain.workflow(
        "report",
        """
        workflow: report
        for_each:
          items: [north]
          spawn: reader
          context: {colour: grey, region: "{{item}}"}
    """,
    )
    with brain.daemon():
        brain.wait_finished("report")
        res = brain.cli("start", "report", "--context", '{"colour": "red", "urgent": true}')
        assert res.rc == 0, res
        brain.wait_finished("report", count=2)
    first, second = _seen(brain)
    assert first == {"colour": "grey", "item": "north", "region": "north"}
    assert second == {"colour": "red", "item": "north", "region": "north", "urgent": True}


def test_send_a_spawn_runs_the_agent_as_a_one_item_run(brain: Brain) -> None:
    """A SPAWN the person sends with `ambient send` runs the agent, seen in `status` and `runs`."""
    brain.python_agent("reader", CONTEXT_AGENT)
    packet = json.dumps(
        {
            "from": "human",
            "to": "reader",
            "signal": "SPAWN",
            "scope": {"zone": "project", "files": ["workspace/notes.md"]},
            "payload": {"context": {"task": "summarise"}},
        }
    )
    with brain.daemon():
        res = brain.cli("send", "-", input=packet)
        assert res.rc == 0, res
        assert "one-item run" in res.out, res
        [record] = brain.wait_finished("spawn-reader")
    assert record["outcome"] == "success"
    [ctx] = _seen(brain)
    assert ctx["task"] == "summarise"
    assert "spawn-reader" in brain.cli("runs").out


def test_a_spawn_sent_without_a_daemon_runs_when_it_starts(brain: Brain) -> None:
    """Without a daemon the SPAWN waits in the inbox and runs at the next `ambient run`."""
    brain.python_agent("reader", CONTEXT_AGENT)
    packet = json.dumps({"from": "human", "to": "reader", "signal": "SPAWN", "payload": {"context": {"n": 1}}})
    assert brain.cli("send", "-", input=packet).rc == 0
    brain.until_idle()
    [record] = brain.finished("spawn-reader")
    assert record["outcome"] == "success"
    assert _seen(brain)[0]["n"] == 1


# Sent a SPAWN, it asks the person with `ambient send` (outside any run); run again with the answer, it notes it.
SENDING_ASKER = """
    import json, os, pathlib, subprocess, sys
    packet = json.load(sys.stdin)
    decision = packet["payload"].get("context", {}).get("decision")
    if decision is None:
        ask = {"from": "asker", "to": "human", "signal": "ESCALATE",
               "payload": {"options": ["yes", "no"], "context": {"question": "Publish the report?"}}}
        subprocess.run([sys.executable, "-m", "ambient", "send", "-"], input=json.dumps(ask), text=True, check=True,
                       capture_output=True)
    else:
        with open(pathlib.Path(os.environ["AMBIENT_BRAIN"], "decisions.log"), "a") as log:
            log.write(decision + " " + os.environ["AMBIENT_KEY"] + "\\n")
    print(json.dumps({"status": "ok"}))
"""


def test_an_answer_to_a_sent_escalate_runs_the_agent_once_whatever_restarts_follow(brain: Brain) -> None:
    """Your answer to an ESCALATE an agent sent outside any run runs that agent again once, not at every start."""
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    brain.python_agent("asker", SENDING_ASKER, runner={"env": env})
    spawn = json.dumps({"from": "human", "to": "asker", "signal": "SPAWN", "payload": {"context": {}}})
    assert brain.cli("send", "-", input=spawn).rc == 0
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "yes").rc == 0
    brain.until_idle()
    [line] = brain.read("decisions.log").splitlines()
    assert line.startswith("yes "), line
    for _ in range(2):  # two restarts: each reads the answered escalation again
        brain.until_idle()
    assert brain.read("decisions.log").splitlines() == [line]
    assert len(brain.finished("spawn-asker")) == 2  # the SPAWN you sent, and the one your answer made
    assert len(brain.escalations(all=True)) == 1


OK_AGENT = """
    import json, os, pathlib, sys
    packet = json.load(sys.stdin)
    ctx = packet["payload"]["context"]
    done = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace", "steps.log")
    done.parent.mkdir(parents=True, exist_ok=True)
    with done.open("a") as fh:
        fh.write(f"{ctx['workflow']}:{ctx['step']}\\n")
    print(json.dumps({"status": "ok", "tests": {"total": 1, "passed": 1, "failed": 0}}))
"""


def test_validate_and_the_daemon_agree_on_which_steps_run(brain: Brain) -> None:
    """After a step whose on_done only notifies, the next step is reached: `validate` and `doctor` say
    nothing about it, and the daemon runs it."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "release",
        """
        name: release
        chain:
          - {step: 1, type: brain-write, scope: workspace/a.md, agents: [worker]}
          - {step: 2, type: brain-write, scope: workspace/b.md, agents: [worker], on_done: 'notify:"b written"'}
          - {step: 3, type: brain-write, scope: workspace/c.md, agents: [worker]}
    """,
    )
    res = brain.cli("validate")
    assert res.rc == 0 and "never reached" not in res.text, res
    assert "never reached" not in brain.cli("doctor").text
    brain.until_idle()
    assert brain.read("workspace/steps.log").split() == ["release:1", "release:2", "release:3"]


def test_a_trigger_naming_another_workflow_starts_a_run_of_it(brain: Brain) -> None:
    """`trigger:<workflow>/<step>` in a chain starts a run of that workflow at that step; the chain goes on."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: workspace/s1.md, agents: [worker]}
          - {step: 2, type: brain-write, scope: workspace/s2.md, agents: [worker]}
    """,
    )
    brain.until_idle()  # its own first run: steps 1 and 2
    brain.workflow(
        "build",
        """
        name: build
        chain:
          - {step: 1, type: brain-write, scope: workspace/build.md, agents: [worker], on_done: "trigger:ship/2"}
          - {step: 2, type: brain-write, scope: workspace/build2.md, agents: [worker]}
    """,
    )
    brain.until_idle()
    steps = brain.read("workspace/steps.log").split()
    assert steps[:2] == ["ship:1", "ship:2"]
    assert sorted(steps[2:]) == ["build:1", "build:2", "ship:2"]
    assert [r["outcome"] for r in brain.finished("ship")] == ["success", "success"]


def test_start_at_a_step_that_does_not_exist_is_refused(brain: Brain) -> None:
    """`ambient start W --step N` names a step of W, or is refused (exit 2) with the steps it has."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "release",
        """
        name: release
        status: draft
        chain:
          - {step: 1, type: brain-write, scope: workspace/a.md, agents: [worker]}
    """,
    )
    res = brain.cli("start", "release", "--step", "9")
    assert res.rc == 2 and "has no step '9'" in res.err and "1" in res.err, res


def test_start_of_a_workflow_that_does_not_load_is_refused(brain: Brain) -> None:
    """`ambient start W` for a file that does not load says why (exit 2), instead of a request dropped unseen."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "broken",
        """
        name: broken
        chain:
          - {step: 1, type: brain-write, scope: workspace/a.md, agents: [worker], timeout: whenever}
    """,
    )
    res = brain.cli("start", "broken")
    assert res.rc == 2 and "does not load" in res.err and "workflows/broken.yml:" in res.err, res
    assert not any((brain.root / ".ambient" / "inbox").glob("*.json"))


def test_runs_counts_items_not_attempts(brain: Brain) -> None:
    """`ambient runs` says how many items were done out of the run's, whatever their attempts (a retried item
    is one item: 3/3, never 3/4)."""
    brain.python_agent(
        "flaky",
        """
        import json, os, sys
        json.load(sys.stdin)
        if os.environ["AMBIENT_ITEM"] == "b" and os.environ["AMBIENT_ATTEMPT"] == "1":
            sys.exit(3)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "batch",
        """
        workflow: batch
        for_each: {items: [a, b, c], spawn: flaky}
        retry: {attempts: 2, backoff: 10ms, max_backoff: 20ms, on: [error]}
    """,
    )
    brain.until_idle()
    line = next(line for line in brain.ok("runs").out.splitlines() if "batch" in line)
    assert "3/3 items done" in line, line


def test_a_typo_in_a_required_key_says_which_it_misspells(brain: Brain) -> None:
    """`spwan:` for the required `spawn:` is reported at its line as a likely misspelling."""
    brain.workflow("typo", "workflow: typo\nfor_each:\n  items: [a]\n  spwan: deploy\n")
    res = brain.cli("validate")
    assert res.rc == 1 and "workflows/typo.yml:4:" in res.out, res
    assert "is 'spwan' a misspelling of 'spawn'?" in res.out, res


def test_a_typo_in_a_nested_block_says_the_key_it_looks_like_at_its_line(brain: Brain) -> None:
    """`backof:` under `retry:` and `optons:` under `on_escalate:` are unknown keys named at their line with the key
    they look like, as every other key of a workflow is (never pydantic's "Extra inputs are not permitted")."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "typo",
        """
        workflow: typo
        for_each: {items: [a], spawn: worker}
        retry:
          attempts: 2
          backof: 5s
        on_escalate:
          optons: [retry, skip]
    """,
    )
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert "workflows/typo.yml:5: retry.backof: unknown key; did you mean 'backoff'?" in res.out, res
    assert "workflows/typo.yml:7: on_escalate.optons: unknown key; did you mean 'options'?" in res.out, res
    assert "Extra inputs" not in res.out, res


def test_an_unknown_key_on_a_step_is_an_error_and_the_chain_never_runs(brain: Brain) -> None:
    """`gaet: human` on a deploy step is refused (a deploy would run without its human gate)."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "deploy",
        """
        name: deploy
        chain:
          - {step: 1, type: deploy, scope: infrastructure/app/, agents: [worker], gaet: human}
    """,
    )
    res = brain.cli("validate")
    assert res.rc == 1 and "unknown key 'gaet' in step 1: did you mean 'gate'?" in res.out, res
    brain.until_idle()
    assert brain.finished("deploy") == [] and not brain.path("workspace/steps.log").exists()


def test_validate_names_every_problem_of_a_step_at_once(brain: Brain) -> None:
    """A misspelt type and a misspelt key on one step are both named in the first `validate`, not one per fix."""
    brain.workflow(
        "deploy",
        """
        name: deploy
        chain:
          - {step: 1, type: tset, scope: infrastructure/app/, gaet: human}
    """,
    )
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert "chain.0.type:" in res.out and "unknown key 'gaet' in step 1: did you mean 'gate'?" in res.out, res


def test_a_chain_steps_own_timeout_and_retry_are_honoured(brain: Brain) -> None:
    """A step's own `retry:` runs it again (an error on its first attempt, then done), and its own
    `timeout:` stops a step whose agent would sleep a minute (the run would hang past the 40 s allowed here)."""
    brain.python_agent(
        "flaky",
        """
        import json, os, sys
        json.load(sys.stdin)
        if os.environ["AMBIENT_ATTEMPT"] == "1":
            sys.exit(3)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.python_agent(
        "sleepy",
        """
        import json, sys, time
        json.load(sys.stdin)
        time.sleep(60)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "steps",
        """
        name: steps
        chain:
          - step: 1
            type: brain-write
            scope: workspace/a.md
            agents: [flaky]
            retry: {attempts: 2, backoff: 10ms, max_backoff: 20ms, on: [error]}
          - {step: 2, type: brain-write, scope: workspace/b.md, agents: [sleepy], timeout: 1s}
    """,
    )
    brain.until_idle(timeout=40)
    [esc] = brain.escalations()
    assert esc["step"] == "2" and "timed out after 1 s" in esc["question"], esc
    [run] = brain.status()["runs"]
    steps = {i["name"]: i for i in run["items"]}
    assert steps["1"]["status"] == "done" and steps["1"]["attempt"] == 2, steps["1"]


def test_every_template_variable_validate_allows_renders(brain: Brain) -> None:
    """`{{error_count}}` (any variable validate allows in on_complete) renders at the run's end; it
    used to pass validate and then crash the run's end at every start."""
    brain.python_agent(
        "mixed",
        """
        import json, os, sys
        json.load(sys.stdin)
        if os.environ["AMBIENT_ITEM"] == "b":
            sys.exit(3)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "tally",
        """
        workflow: tally
        for_each: {items: [a, b, c], spawn: mixed}
        on_complete:
          signal: RETURN
          to: orchestrator
          payload: {result: "{{success_count}}/{{total}} {{fail_count}} {{error_count}} {{skipped_count}}"}
    """,
    )
    assert brain.cli("validate").rc == 0
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "abort").rc == 0
    brain.until_idle()
    [record] = brain.finished("tally")
    assert record["outcome"] == "aborted"
    brain.workflow(
        "tally2",
        """
        workflow: tally2
        for_each: {items: [a, b, c], spawn: mixed, on_return: {error: → next_item}}
        on_complete:
          signal: RETURN
          to: orchestrator
          payload: {result: "{{success_count}}/{{total}} ok, {{fail_count}} failed, {{error_count}} by errors"}
    """,
    )
    brain.until_idle()
    [record] = brain.finished("tally2")
    assert record["outcome"] == "partial", record
    thread = brain.ok("thread", "ambient").out  # the RETURN is a turn of its sender's thread
    assert "RETURN     ambient -> orchestrator" in thread and "2/3 ok, 1 failed, 1 by errors" in thread, thread


def test_a_chain_steps_scope_template_is_rendered(brain: Brain) -> None:
    """A chain step's `scope: workspace/{{workflow}}/...` reaches its agent rendered, as validate promised."""
    brain.python_agent(
        "writer", COLOUR_AGENT.replace('if "decision" not in ctx:', "if False:").replace('ctx["decision"]', '"written"')
    )
    brain.workflow(
        "tmpl",
        """
        name: tmpl
        chain:
          - {step: 1, type: brain-write, scope: "workspace/{{workflow}}/notes.md", agents: [writer]}
    """,
    )
    brain.until_idle()
    assert brain.read("workspace/tmpl/notes.md") == "written\n"


def test_a_spawn_naming_a_missing_agent_says_which_agent_it_looks_like(brain: Brain) -> None:
    """A misspelt agent in `spawn:` gets the same did-you-mean as a misspelt key."""
    brain.python_agent("checker", OK_AGENT)
    brain.workflow("checks", FOR_EACH.format(name="checks", agent="chekcer", items="[a]"))
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert (
        "workflows/checks.yml:4: spawn: agent 'chekcer' does not exist in agents/; did you mean 'checker'?"
        in res.out.splitlines()
    ), res


def test_skip_counts_as_not_done_in_the_runs_outcome(brain: Brain) -> None:
    """docs/workflows.md: a skipped item is not done: skipping the only item ends the run `failed` 0/1, skipping
    one of several that otherwise succeed ends it `partial`."""
    brain.python_agent("flaky", SOME_FAIL_AGENT)
    brain.workflow("alone", FOR_EACH.format(name="alone", agent="flaky", items="[bad-1]"))
    brain.workflow("some", FOR_EACH.format(name="some", agent="flaky", items="[ok-1, bad-2]"))
    brain.until_idle()
    for esc in brain.escalations():
        assert brain.decide(esc["id"], "skip").rc == 0
    brain.until_idle()
    [alone] = brain.finished("alone")
    [some] = brain.finished("some")
    assert (alone["outcome"], alone["done"], alone["total"]) == ("failed", 0, 1), alone
    assert (some["outcome"], some["done"], some["total"]) == ("partial", 1, 2), some
    assert re.search(r"alone\s+failed\s+0/1 items done", brain.ok("runs", "alone").out)


def test_every_spawn_payload_carries_decision_null_beside_the_context(brain: Brain) -> None:
    """docs/workflows.md: a first run's SPAWN has `payload.decision: null` (a field of every packet) and no
    `payload.context.decision`; the answer to a question arrives in `payload.context.decision`."""
    brain.python_agent("colour", COLOUR_AGENT.replace("packet = json.load(sys.stdin)", SAVE_PACKET))
    brain.workflow("paint", FOR_EACH.format(name="paint", agent="colour", items="[wall]"))
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "blue").rc == 0
    brain.until_idle()
    first, again = (json.loads(line) for line in brain.read("workspace/packets.jsonl").splitlines())
    assert "decision" in first["payload"] and first["payload"]["decision"] is None, first
    assert "decision" not in first["payload"]["context"], first
    assert again["payload"]["context"]["decision"] == "blue", again


def test_a_copy_of_a_workflow_file_never_takes_its_name_from_the_original(brain: Brain) -> None:
    """A person copies `ship.yml` to `ship-copy.yml` (the name sorts first) without renaming what is inside: the
    copy is the file refused, naming the original, and the original keeps running (docs/workflows.md)."""
    brain.python_agent("deploy", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n")
    text = (
        "workflow: ship\nstatus: draft\nfor_each:\n  items: [a]\n  spawn: deploy\n"
        '  scope: {zone: project, files: ["work/ship/{{index}}.txt"]}\n'
    )
    original = brain.workflow("ship", text)
    os.utime(original, (original.stat().st_atime, original.stat().st_mtime - 60))  # written a minute ago
    brain.workflow("ship-copy", text)
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert "workflows/ship-copy.yml:1: workflow name 'ship' is already used by workflows/ship.yml" in res.out, res
    assert "workflows/ship.yml:" not in res.out.replace("used by workflows/ship.yml", ""), res
    assert brain.ok("start", "ship").rc == 0
    [record] = brain.until_idle() and brain.finished("ship")
    assert record["outcome"] == "success", record
