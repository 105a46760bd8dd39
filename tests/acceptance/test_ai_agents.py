"""docs/agents-and-runners.md, "Running AI agents": a brain's prompts run on the real Claude Code CLI (the SDK's
bundled binary) against a fake Anthropic Messages API on 127.0.0.1, as a person drives them: files dropped,
`ambient decide`, what `status`, `thread`, `runs`, `stats` and the files show.

The fake model follows the playbook written in each agent's prompt (ambient.testing.fakeapi): it calls the tools the
playbook lists, one per turn, then gives its answer; told "denied", it gives the playbook's ``on_deny`` answer.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import Brain, FakeTelegram, ai_agent_md, for_each, playbook, wait

pytest.importorskip("claude_agent_sdk", reason="the claude extra (pip install 'ambient[claude]') is not installed")

from ambient.testing.fakeapi import FakeAnthropic

CLAUDE = {"kind": "claude", "timeout_s": 120}
DONE = {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}
#: A long wait: each agent is a real Claude Code process (about a second each on CI's two cores).
AI_WAIT = 120.0


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def ai_brain(brain: Brain, api: FakeAnthropic) -> Brain:
    """A fresh brain whose daemon reaches the fake model API with a key (as a person exports it)."""
    brain.env.update({"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "sk-ant-acceptance-key-0123456789"})
    return brain


def _items_asked(api: FakeAnthropic) -> set[str]:
    """The items the model was asked about (ambient's brief says ``Item: <name>``)."""
    found = set()
    for rec in api.requests:
        for message in (rec.body or {}).get("messages", [])[:1]:
            content = message.get("content")
            texts = [content] if isinstance(content, str) else [c.get("text", "") for c in content or []]
            for text in texts:
                for line in str(text).splitlines():
                    if line.startswith("Item: "):
                        found.add(line[6:].strip())
    return found


def _escalation(brain: Brain, kind: str) -> dict[str, Any]:
    [esc] = brain.wait_escalation(f"a {kind} escalation", where=lambda e: e["kind"] == kind, timeout=AI_WAIT)
    return esc


def _keys(esc: dict[str, Any]) -> list[str]:
    return [o["key"] for o in esc["options"]]


def _thread(brain: Brain, agent: str, shows: str, count: int = 1) -> str:
    """``ambient thread <agent>`` once it shows ``shows`` (``count`` times): the daemon writes live turns in batches
    a moment after they happen, so read it while the daemon runs."""

    def shown() -> str | None:
        out = brain.ok("thread", agent).out
        return out if out.count(shows) >= count else None

    found: str = wait(shown, f"{shows!r} x{count} in the thread of {agent}", timeout=AI_WAIT)
    return found


def test_a_for_each_over_a_claude_agent_returns_and_records_its_cost(ai_brain: Brain, api: FakeAnthropic) -> None:
    """Five items over one Claude agent: five RETURNs, the run recorded with its model, tokens and cost, `stats`
    shows the cost, and the agent's live thread shows what it said."""
    brain = ai_brain
    brain.write("agents/writer.md", ai_agent_md("writer", "You write release notes.", runner=CLAUDE))
    brain.workflow("notes", for_each("notes", "writer", ["a", "b", "c", "d", "e"]))
    with brain.daemon():
        [record] = brain.wait_finished("notes", timeout=AI_WAIT)
        thread = _thread(brain, "writer", "RETURN     writer -> ambient", count=5)
    assert record["outcome"] == "success", record
    assert len(record["steps"]) == 5
    for step in record["steps"]:
        assert step["result"] == "success"
        assert step["usage"]["cost_usd"] > 0
        assert step["usage"]["session_id"]
        assert step["usage"]["model"]
    assert record["cost_usd"] == pytest.approx(sum(s["usage"]["cost_usd"] for s in record["steps"]), abs=1e-5)
    assert _items_asked(api) == {"a", "b", "c", "d", "e"}
    stats = brain.ok("stats", "--json").json()
    [wf] = stats["workflows"]
    assert wf["cost"]["cost_usd"] == pytest.approx(record["cost_usd"], abs=1e-5)
    assert stats["cost"]["steps"] == 5
    assert "$" in brain.ok("stats").out
    assert thread.count("RETURN     writer -> ambient") == 5, thread
    assert "StructuredOutput" not in thread  # how the answer travelled is not a turn of its own


def test_a_write_outside_the_scope_is_denied_without_asking_anyone(ai_brain: Brain) -> None:
    """The agent tries to write outside its item's scope: denied at once, told why, nobody asked; the thread says
    so and the file is not there."""
    brain = ai_brain
    body = "You file notes.\n\n" + playbook(
        {"tool": "Write", "input": {"file_path": "elsewhere/$ITEM.md", "content": "sneaky"}},
        DONE,
        {"on_deny": {"signal": "RETURN", "result": {"status": "partial", "note": "could not write"}}},
    )
    brain.write("agents/filer.md", ai_agent_md("filer", body, runner=CLAUDE))
    brain.workflow("filing", for_each("filing", "filer", ["x"]))
    with brain.daemon():
        [record] = brain.wait_finished("filing", timeout=AI_WAIT)
        _thread(brain, "filer", "outside this item's scope (work/filing/1.txt)")
    assert record["outcome"] == "success", record
    assert record["escalations"] == 0
    assert brain.escalations(all=True) == []
    assert not brain.path("elsewhere/x.md").exists()


def _bash_agent(brain: Brain, command: str, **runner: Any) -> None:
    body = "You build things.\n\n" + playbook(
        {"tool": "Bash", "input": {"command": command}},
        DONE,
        {"on_deny": {"signal": "RETURN", "result": {"status": "partial", "note": "not built: the person said no"}}},
    )
    brain.write("agents/coder.md", ai_agent_md("coder", body, runner={**CLAUDE, **runner}))
    brain.write("work/out/.keep", "")


def _building(name: str, **kw: str) -> str:
    """A for_each of coder over the item ``a`` whose scope is the folder ``work/out``, where its commands write (a
    command writes only its scope, whoever allowed it: Claude Code runs confined)."""
    return for_each(name, "coder", ["a"], **kw).replace(f'"work/{name}/{{{{index}}}}.txt"', '"work/out"')


def test_a_bash_call_waits_for_the_person_and_runs_once_allowed(ai_brain: Brain, api: FakeAnthropic) -> None:
    """Bash outside the agent's allowlist is a question: "coder wants to run `…` in …" with allow | allow always |
    deny. `ambient decide <id> allow`: the session resumes, the command runs once, the item returns."""
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/$ITEM.log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        esc = _escalation(brain, "permission")
        assert esc["question"] == "coder wants to run `echo built >> work/out/a.log` in the brain's root"
        assert _keys(esc)[:3] == ["allow", "allow-always", "deny"]  # then the item's own: skip, abort
        assert not brain.path("work/out/a.log").exists()  # nothing ran while it waited
        res = brain.decide(esc["id"], "allow")
        assert res.rc == 0, res
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert brain.read("work/out/a.log") == "built\n"
    # The session was resumed, not started afresh: the last request carries the first session's tool call.
    last = api.requests[-1].body or {}
    assert any(
        block.get("type") == "tool_use" and block.get("name") == "Bash"
        for m in last.get("messages", [])
        for block in (m.get("content") if isinstance(m.get("content"), list) else [])
    )


def test_a_denied_bash_call_is_told_to_the_agent_which_ends_as_it_chooses(ai_brain: Brain) -> None:
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/$ITEM.log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        esc = _escalation(brain, "permission")
        assert brain.decide(esc["id"], "deny").rc == 0
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
        _thread(brain, "coder", "not built: the person said no")
    assert record["outcome"] == "success", record
    assert not brain.path("work/out/a.log").exists()


@pytest.mark.slow
def test_allow_always_stops_asking_for_that_command(ai_brain: Brain) -> None:
    """`allow always`: the next run's same command runs without a question; another command still asks."""
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        esc = _escalation(brain, "permission")
        assert brain.decide(esc["id"], "allow-always").rc == 0
        brain.wait_finished("build", timeout=AI_WAIT)
        brain.ok("start", "build")
        brain.wait_finished("build", count=2, timeout=AI_WAIT)
    assert brain.read("work/out/log") == "built\nbuilt\n"
    assert len(brain.escalations(all=True)) == 1
    assert brain.ok("grants").out.strip() == "coder  Bash: echo built >> work/out/log"
    assert brain.ok("grants", "--json").json() == {"coder": ["Bash: echo built >> work/out/log"]}
    assert brain.cli("grants", "forget", "coder", "Bash: something else").rc == 1
    assert "forgot 1 grant" in brain.ok("grants", "forget", "coder", "Bash: echo built >> work/out/log").out
    with brain.daemon():
        brain.ok("start", "build")
        _escalation(brain, "permission")  # asked again


def _one_item(name: str, item: str) -> str:
    """A for_each of coder over one item whose scope is ``work/out``, where its commands write."""
    return for_each(name, "coder", [item]).replace(f'"work/{name}/{{{{index}}}}.txt"', '"work/out"')


@pytest.mark.slow
def test_commands_of_one_shape_you_allowed_offer_a_pattern_only_you_can_accept(ai_brain: Brain) -> None:
    """You allowed `touch work/out/a.ran`, `…/b.ran`, `…/c.ran`: the fourth question also offers "allow `touch
    work/out/*.ran` for coder from now on". Accepted, the fifth command of the shape runs without a question; the
    same command with `; cat profil/x` appended is still a question; `ambient grants` lists the pattern, and
    forgetting it brings the question back."""
    brain = ai_brain
    _bash_agent(brain, "touch work/out/$ITEM.ran")
    with brain.daemon():
        asked: list[dict[str, Any]] = []
        for n, item in enumerate("abcd", start=1):
            brain.workflow(f"shape-{item}", _one_item(f"shape-{item}", item))
            [esc] = brain.wait_escalation(
                f"the question about item {item}",
                where=lambda e, i=item: e["kind"] == "permission" and e["item"] == i,
                timeout=AI_WAIT,
            )
            asked.append(esc)
            assert esc["question"].startswith(f"coder wants to run `touch work/out/{item}.ran`"), esc["question"]
            if n < 4:  # three commands allowed: no pattern offered yet
                assert _keys(esc) == ["allow", "allow-always", "deny", "skip", "abort"], esc["options"]
                assert brain.decide(esc["id"], "allow").rc == 0
            brain_records = None if n == 4 else brain.wait_finished(f"shape-{item}", timeout=AI_WAIT)
            assert brain_records is None or brain_records[0]["outcome"] == "success", brain_records
        fourth = asked[-1]
        offered = {o["key"]: o["label"] for o in fourth["options"]}
        assert offered.get("allow-pattern") == "allow `touch work/out/*.ran` for coder from now on", fourth["options"]
        assert "`touch work/out/*.ran`" in fourth["question"]  # what Telegram and `escalations` show, too
        assert brain.decide(fourth["id"], "allow-pattern").rc == 0
        brain.wait_finished("shape-d", timeout=AI_WAIT)
        brain.workflow("shape-e", _one_item("shape-e", "e"))
        [fifth] = brain.wait_finished("shape-e", timeout=AI_WAIT)
        assert (fifth["outcome"], fifth["escalations"]) == ("success", 0), fifth
        assert brain.path("work/out/e.ran").exists()
        assert brain.ok("grants").out.strip() == "coder  Bash pattern: touch work/out/*.ran"
        # The whole command is judged: a tail after the pattern's shape is a question, never swallowed by `*`.
        _bash_agent(brain, "touch work/out/$ITEM.ran; cat profil/x")
        brain.workflow("shape-f", _one_item("shape-f", "f"))
        [tail] = brain.wait_escalation(
            "the question about the longer command", where=lambda e: e["item"] == "f", timeout=AI_WAIT
        )
        assert tail["question"] == "coder wants to run `touch work/out/f.ran; cat profil/x` in the brain's root"
        assert "allow-pattern" not in _keys(tail)
        assert brain.decide(tail["id"], "deny").rc == 0
        brain.wait_finished("shape-f", timeout=AI_WAIT)
        assert not brain.path("work/out/f.ran").exists()
        # Forgotten, the pattern allows nothing: the next command of the shape is a question again.
        forgot = brain.ok("grants", "forget", "coder", "Bash pattern: touch work/out/*.ran")
        assert "forgot 1 grant" in forgot.out
        assert brain.ok("grants").out.strip().startswith("no grants")
        _bash_agent(brain, "touch work/out/$ITEM.ran")
        brain.workflow("shape-g", _one_item("shape-g", "g"))
        [again] = brain.wait_escalation("the question about item g", where=lambda e: e["item"] == "g", timeout=AI_WAIT)
        assert again["question"].startswith("coder wants to run `touch work/out/g.ran`"), again
        assert "allow-pattern" not in _keys(again)  # the commands it was learned from were forgotten with it
    assert sorted(p.name for p in brain.path("work/out").glob("*.ran")) == ["a.ran", "b.ran", "c.ran", "d.ran", "e.ran"]


def test_the_allowlist_lets_a_command_run_without_asking(ai_brain: Brain) -> None:
    brain = ai_brain
    _bash_agent(brain, "touch work/out/$ITEM.log", allowed_tools=["Bash(touch:*)"])
    brain.workflow("build", _building("build"))
    with brain.daemon():
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
    assert record["escalations"] == 0
    assert brain.path("work/out/a.log").exists()


@pytest.mark.slow
def test_a_permission_is_answered_by_a_telegram_button(ai_brain: Brain, telegram: FakeTelegram, tmp_path: Path) -> None:
    """The question reaches Telegram with one button per answer; a press allows it and the agent goes on."""
    brain = ai_brain
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "telegram-token").write_text(telegram.token + "\n")
    brain.env["CREDENTIALS_DIRECTORY"] = str(creds)
    brain.config(f'telegram: {{answers: true, chat_id: "4242", api_base: "{telegram.api_base}", poll_timeout_s: 1}}\n')
    _bash_agent(brain, "echo built >> work/out/$ITEM.log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        esc = _escalation(brain, "permission")

        def message() -> tuple[int, dict[str, Any]] | None:
            with telegram.lock:
                for n, msg in enumerate(telegram.messages, start=1):
                    if f"Ref: {esc['id']}" in str(msg.get("text", "")):
                        return n, msg
            return None

        message_id, msg = wait(message, "the question on Telegram")
        assert "coder wants to run `echo built >> work/out/a.log`" in msg["text"]
        buttons = telegram.buttons(msg)
        assert [b["text"] for b in buttons][:3] == ["1. allow", "2. allow-always", "3. deny"]
        telegram.press(buttons[0], chat_id=4242, message_id=message_id)
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
    assert record["outcome"] == "success"
    assert brain.read("work/out/a.log") == "built\n"


@pytest.mark.slow
def test_an_answer_after_a_kill_9_resumes_the_session_and_the_item_completes_once(
    ai_brain: Brain, api: FakeAnthropic
) -> None:
    """kill -9 of the daemon while the agent waits on a permission; the person answers while it is down; at the
    next start the session resumes and the command runs exactly once."""
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/$ITEM.log")
    brain.workflow("build", _building("build"))
    daemon = brain.daemon().start()
    try:
        esc = _escalation(brain, "permission")
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)  # type: ignore[union-attr]
        assert brain.decide(esc["id"], "allow").rc == 0
    finally:
        daemon.kill()
    with brain.daemon():
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert brain.read("work/out/a.log") == "built\n"


def _ambient_processes(brain: Path) -> list[int]:
    """Live processes started for this brain (their environment names it), the daemon's own excepted."""
    found = []
    marker = f"AMBIENT_BRAIN={brain}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_kill_9_mid_session_leaves_no_claude_behind_and_the_item_resumes(ai_brain: Brain) -> None:
    """kill -9 of the daemon while a Claude agent runs a command: Claude Code dies with the daemon, what it had
    started is swept at the next start, and the item resumes and completes once. `status` showed the command.

    The command waits for `work/go`, made only once the resumed session has started it again: the kill always lands
    mid-command (a `sleep 2` once let a slow `status` under load see the command finish first), and the first
    command, had it outlived the sweep, would write its line too."""
    brain = ai_brain
    command = (
        "echo start >> work/out/$ITEM.starts; until [ -e work/go ]; do sleep 0.1; done; echo once >> work/out/$ITEM.log"
    )
    _bash_agent(brain, command, allowed_tools=["Bash"])
    brain.workflow("slowbuild", _building("slowbuild"))
    daemon = brain.daemon().start()
    try:

        def doing() -> str | None:
            for run in brain.status()["runs"]:
                for item in run["items"]:
                    if item.get("now"):
                        return str(item["now"]["tool"])
            return None

        assert wait(doing, "status to show the agent's command", timeout=AI_WAIT) == "Bash: " + command.replace(
            "$ITEM", "a"
        )
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)  # type: ignore[union-attr]
    finally:
        daemon.kill()
    with brain.daemon():
        starts = brain.path("work/out/a.starts")
        wait(lambda: starts.exists() and starts.read_text() == "start\nstart\n", "the resumed command", timeout=AI_WAIT)
        brain.write("work/go", "")
        [record] = brain.wait_finished("slowbuild", timeout=AI_WAIT)
        assert record["outcome"] == "success", record
    wait(lambda: not _ambient_processes(brain.root), "no process of this brain left", timeout=30)
    assert brain.read("work/out/a.log") == "once\n"


def test_a_budget_reached_stops_new_spawns_and_asks_once(ai_brain: Brain, api: FakeAnthropic) -> None:
    """`budget: {per_run_usd}`: once a run has spent it, no new agent starts and the person gets one escalation
    (raise | wait | abort)."""
    brain = ai_brain
    brain.config("""
        concurrency: 1
        budget:
          per_run_usd: 0.01
    """)
    brain.write("agents/writer.md", ai_agent_md("writer", "You write.", runner=CLAUDE))
    brain.workflow("notes", for_each("notes", "writer", ["a", "b", "c"]))
    with brain.daemon():
        esc = _escalation(brain, "budget")
        assert _keys(esc) in (["raise", "wait", "abort"], ["raise", "raise-x2", "wait", "abort"])
        assert "budget" in esc["question"]
        asked = _items_asked(api)
        assert len(asked) == 1, asked
        assert len([e for e in brain.escalations() if e["kind"] == "budget"]) == 1
        assert brain.decide(esc["id"], "abort").rc == 0
        [record] = brain.wait_finished("notes", timeout=AI_WAIT)
    assert record["outcome"] == "aborted"
    assert len(_items_asked(api)) == 1


def test_a_plain_text_answer_is_a_return_with_its_text(ai_brain: Brain) -> None:
    brain = ai_brain
    body = "You review.\n\n" + playbook({"text": "Looks good to me, nothing to change."})
    brain.write("agents/reviewer.md", ai_agent_md("reviewer", body, runner=CLAUDE))
    brain.workflow("review", for_each("review", "reviewer", ["pr-1"]))
    with brain.daemon():
        [record] = brain.wait_finished("review", timeout=AI_WAIT)
        _thread(brain, "reviewer", "Looks good to me, nothing to change.")
    assert record["outcome"] == "success", record


def test_a_refused_key_asks_the_person_once_and_retry_goes_on(ai_brain: Brain, api: FakeAnthropic) -> None:
    """A 401 from the model API: no retry storm, one escalation for the run; fixed and answered `retry`, the items
    run."""
    brain = ai_brain
    api.fail(401)
    brain.write("agents/writer.md", ai_agent_md("writer", "You write.", runner=CLAUDE))
    brain.workflow("notes", for_each("notes", "writer", ["a", "b", "c"]))
    with brain.daemon():
        esc = _escalation(brain, "provider")
        assert "refused" in esc["question"] and "401" in esc["question"]
        assert _keys(esc) == ["retry", "abort"]
        assert len(api.requests) <= 3  # at most one request per item: Claude Code's own retries were cut
        assert len([e for e in brain.escalations() if e["kind"] == "provider"]) == 1
        api.fail(None)
        assert brain.decide(esc["id"], "retry").rc == 0
        [record] = brain.wait_finished("notes", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert _items_asked(api) == {"a", "b", "c"}


@pytest.mark.slow
def test_the_corpus_brain_runs_every_agent_on_claude_by_default(
    tmp_path: Path, api: FakeAnthropic, corpus: Path
) -> None:
    """The public brain's 56 agents, unedited, plus `runners: {default: {kind: claude}}`: it validates, and a
    for_each over one of them runs against the model API."""
    brain = Brain.init(tmp_path / "brain", "--no-example")
    brain.env.update({"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "sk-ant-acceptance-key-0123456789"})
    for md in sorted((corpus / "agents").glob("*.md")):
        shutil.copy(md, brain.path(f"agents/{md.name}"))
    brain.config("""
        runners:
          default: {kind: claude, timeout_s: 120}
    """)
    brain.workflow(
        "vps-check",
        "workflow: vps-check\n"
        "sender: orchestrator\n"
        "for_each:\n"
        '  items: ["web-1", "web-2"]\n'
        "  spawn: vps\n"
        '  scope: {zone: project, files: ["projets/vps/{{item}}.md"]}\n',
    )
    res = brain.cli("validate")
    assert res.rc == 0, res
    with brain.daemon():
        [record] = brain.wait_finished("vps-check", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert _items_asked(api) == {"web-1", "web-2"}
    assert [s["agent"] for s in record["steps"]] == ["vps", "vps"]
    assert {c["agent"] for c in record["calls_by"]} == {"vps"}  # its model calls, by model


def test_init_offers_a_commented_claude_agent_that_validates_once_copied(example_brain: Brain) -> None:
    """`ambient init` writes agents/_claude-agent.md (a template: skipped); copied to a name, it is a Claude agent
    `ambient validate` accepts and `ambient doctor` checks for its CLI and key (named, never shown)."""
    brain = example_brain
    template = brain.read("agents/_claude-agent.md")
    assert "kind: claude" in template and "allowed_tools" in template
    brain.write("agents/reviewer.md", template)
    assert brain.cli("validate").rc == 0
    res = brain.cli("doctor", env={"ANTHROPIC_API_KEY": "sk-ant-secret-value-42"})
    assert "ANTHROPIC_API_KEY is set" in res.out, res
    assert "sk-ant-secret-value-42" not in res.text
    res = brain.cli("doctor", env={"ANTHROPIC_API_KEY": ""})
    assert res.rc == 1 and "no model key for agent reviewer" in res.out, res


@pytest.mark.slow
def test_sigterm_stops_a_claude_agent_cleanly_and_the_next_start_resumes_it(ai_brain: Brain) -> None:
    """systemctl stop while a Claude agent runs a command: the daemon exits, nothing of the agent is left
    running, and the next start resumes the item, which completes once."""
    brain = ai_brain
    # The command runs until the test lets it end (work/out/go), once the stop is sent: the stop comes while it
    # runs however slow the machine (a fixed `sleep 3` could end before a loaded machine's `ambient status` saw it).
    command = "until [ -e work/out/go ]; do sleep 0.05; done; echo once >> work/out/$ITEM.log"
    _bash_agent(brain, command, allowed_tools=["Bash"])
    brain.workflow("slowbuild", _building("slowbuild"))
    with brain.daemon() as daemon:
        wait(lambda: _doing(brain), "the agent to run its command", timeout=AI_WAIT)
        daemon.signal(signal.SIGTERM)  # systemctl stop, the command running
        brain.write("work/out/go", "")
        assert daemon.proc is not None and daemon.proc.wait(timeout=60) == 0
    assert _ambient_processes(brain.root) == []
    with brain.daemon():
        [record] = brain.wait_finished("slowbuild", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert brain.read("work/out/a.log") == "once\n"


def _doing(brain: Brain) -> str | None:
    """The tool a running item's agent is using now, as `ambient status --json` shows it."""
    for run in brain.status()["runs"]:
        for item in run["items"]:
            if item.get("now"):
                return str(item["now"]["tool"])
    return None


@pytest.mark.slow
def test_a_claude_agent_over_its_timeout_is_stopped_and_leaves_nothing_running(ai_brain: Brain) -> None:
    brain = ai_brain
    # The interpreter by its path: a confined agent runs no program from the person's home (a pyenv shim).
    command = f"{sys.executable} -c 'import time; time.sleep(60)'"
    _bash_agent(brain, command, allowed_tools=["Bash"], timeout_s=3)
    brain.workflow("stuck", _building("stuck", extra="  on_return:\n    error: [abort]\n"))
    with brain.daemon():
        [record] = brain.wait_finished("stuck", timeout=AI_WAIT)
        assert record["steps"][0]["result"] == "error"
        assert "ran over its timeout of 3 s" in record["steps"][0]["error"]
        wait(lambda: not _ambient_processes(brain.root), "the agent's processes gone", timeout=30)


@pytest.mark.slow
def test_a_learned_rule_allows_a_command_you_always_allow(ai_brain: Brain) -> None:
    """You allowed `echo built >> work/out/log` four times: the rule is active; opted in for the workflow, the
    next time it is allowed without asking you (and you are told)."""
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        for n in range(1, 5):
            if n > 1:
                brain.ok("start", "build")
            esc = _escalation(brain, "permission")
            assert brain.decide(esc["id"], "allow").rc == 0
            brain.wait_finished("build", count=n, timeout=AI_WAIT)
        [rule] = brain.ok("rules", "--json").json()["rules"]
        assert (rule["state"], rule["option"]) == ("active", "allow"), rule
        assert "Bash: echo built >> work/out/log" in json.dumps(rule)
        brain.ok("rules", "optin", "--workflow", "build")
        brain.ok("start", "build")
        [record] = brain.wait_finished("build", count=5, timeout=AI_WAIT)[-1:]
    assert record["outcome"] == "success", record
    assert [d["auto"] for d in record["decisions"]] == [True]
    assert brain.read("work/out/log") == "built\n" * 5
    assert len(brain.escalations(all=True)) == 5  # four asked you, the fifth was answered by the rule


# ---------------------------------------------------------------- kind: llm


def test_an_llm_agent_answers_in_one_call_with_its_cost(ai_brain: Brain, api: FakeAnthropic) -> None:
    """`kind: llm` over the Anthropic Messages API: one request per item, the answer on the contract, the cost
    recorded, the agent's body as a cached system prefix identical for every item."""
    brain = ai_brain
    brain.write("agents/summary.md", ai_agent_md("summary", "You summarise.", runner={"kind": "llm", "model": "haiku"}))
    brain.workflow("sum", for_each("sum", "summary", ["a", "b", "c"]))
    with brain.daemon():
        [record] = brain.wait_finished("sum", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert len(api.requests) == 3
    assert all(s["usage"]["cost_usd"] > 0 for s in record["steps"])
    calls = _check_recorded_is_billed(brain, api)  # through the model gateway, like a Claude agent's
    assert record["cost_usd"] == pytest.approx(sum(c["usage"]["cost_usd"] for c in calls), abs=1e-6)
    systems = {json.dumps(r.body["system"]) for r in api.requests if r.body}
    assert len(systems) == 1 and "cache_control" in next(iter(systems))


def test_an_llm_agent_on_an_openai_compatible_server(ai_brain: Brain) -> None:
    """`provider: openai` at a `base_url` (Ollama, vLLM, llama.cpp…): no key needed, the answer on the contract."""
    from ambient.testing.fakeapi import FakeOpenAI

    brain = ai_brain
    with FakeOpenAI() as local:
        runner = {"kind": "llm", "provider": "openai", "base_url": f"{local.url}/v1", "model": "llama3.1"}
        brain.write("agents/tagger.md", ai_agent_md("tagger", "You tag.", runner=runner))
        brain.workflow("tags", for_each("tags", "tagger", ["a", "b"]))
        with brain.daemon():
            [record] = brain.wait_finished("tags", timeout=AI_WAIT)
        assert record["outcome"] == "success", record
        assert len([r for r in local.requests if r.path.endswith("/chat/completions")]) == 2


def test_an_llm_agent_with_a_refused_key_asks_once(ai_brain: Brain, api: FakeAnthropic) -> None:
    brain = ai_brain
    api.fail(401)
    brain.write("agents/summary.md", ai_agent_md("summary", "You summarise.", runner={"kind": "llm"}))
    brain.workflow("sum", for_each("sum", "summary", ["a", "b", "c", "d"]))
    with brain.daemon():
        esc = _escalation(brain, "provider")
        assert "anthropic" in esc["question"] and "401" in esc["question"]
        assert len(api.requests) <= 4
        assert len(brain.escalations()) == 1
        assert "sk-ant-acceptance-key" not in json.dumps(brain.escalations())


def test_a_daemon_without_the_model_key_says_so_at_start(brain: Brain) -> None:
    brain.write("agents/writer.md", ai_agent_md("writer", "You write.", runner=CLAUDE))
    with brain.daemon(env={"ANTHROPIC_API_KEY": ""}) as daemon:
        [line] = daemon.wait_log("model_key_missing")
    assert line["agents"] == ["writer"] and "ANTHROPIC_API_KEY" in line["key"]


def test_runner_keys_replace_prompt_workdir_and_a_key_from_credentials(
    brain: Brain, api: FakeAnthropic, tmp_path: Path
) -> None:
    """`system_prompt: replace` sends the body and contract alone (no Claude Code preset); `workdir` is where its
    commands run; the key may come from `$CREDENTIALS_DIRECTORY/anthropic_api_key` instead of the environment."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "anthropic_api_key").write_text("sk-ant-from-a-credential-file\n")
    brain.env.update({"ANTHROPIC_BASE_URL": api.url, "CREDENTIALS_DIRECTORY": str(creds)})
    brain.write("projets/app/.keep", "")
    body = "ONLY THIS BODY.\n\n" + playbook({"tool": "Bash", "input": {"command": "pwd > where.txt"}}, DONE)
    runner = {**CLAUDE, "system_prompt": "replace", "workdir": "projets/app", "allowed_tools": ["Bash"]}
    brain.write("agents/builder.md", ai_agent_md("builder", body, runner=runner))
    brain.workflow("b", for_each("b", "builder", ["a"]).replace('"work/b/{{index}}.txt"', '"projets/app/where.txt"'))
    with brain.daemon(env={"ANTHROPIC_API_KEY": ""}):
        [record] = brain.wait_finished("b", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert brain.read("projets/app/where.txt").strip() == str(brain.path("projets/app").resolve())
    main = next(r for r in api.requests if r.body and "How to answer (ambient)" in json.dumps(r.body.get("system")))
    system = json.dumps(main.body["system"])
    assert "ONLY THIS BODY." in system and "You are Claude Code" not in system
    assert "sk-ant-from-a-credential-file" in json.dumps(main.headers)


def test_raise_after_a_step_that_spent_sixty_budgets_lets_the_next_agent_start(
    ai_brain: Brain, api: FakeAnthropic
) -> None:
    """One step spends far more than `per_run_usd`: the question says what was spent, by which agent, against which
    budget, and `ambient decide <esc> raise` moves the run (to what it spent plus one budget): the next agent starts.
    Held again, `raise --note '$1'` allows up to the amount given: the last agent starts and the run succeeds."""
    brain = ai_brain
    brain.config("""
        concurrency: 1
        budget:
          per_run_usd: 0.00002
    """)
    long_brief = "You summarise the notes you are given, carefully. " * 1500  # about $0.0024 a call: 120 budgets
    brain.write("agents/summary.md", ai_agent_md("summary", long_brief, runner={"kind": "llm", "model": "haiku"}))
    brain.workflow("sum", for_each("sum", "summary", ["a", "b", "c"]))
    with brain.daemon():
        esc = _escalation(brain, "budget")
        assert len(api.requests) == 1
        [run] = brain.ok("status", "--json").json()["runs"]
        spent = run["cost_usd"]
        assert spent >= 60 * 0.00002, spent
        question = esc["question"]
        assert "summary" in question and "$0.00002" in question, question
        assert f"${spent:.4f}".rstrip("0") + " spent" in question, question
        assert brain.decide(esc["id"], "raise").rc == 0
        wait(lambda: len(api.requests) >= 2, "the next agent of the run to start", timeout=AI_WAIT)
        [again] = brain.wait_escalation("the budget reached again", where=lambda e: e["id"] != esc["id"])
        assert len(api.requests) == 2
        raised = brain.decide(again["id"], "raise", "--note", "$1")
        assert raised.rc == 0 and "the cap raised to $1.00 as your note says" in raised.out, raised
        [record] = brain.wait_finished("sum", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    assert len(api.requests) == 3


def _user_texts(body: dict[str, Any] | None) -> str:
    """Every user message's text of one request to the model."""
    texts: list[str] = []
    for m in (body or {}).get("messages", []):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        for block in [content] if isinstance(content, str) else content or []:
            texts.append(block if isinstance(block, str) else str(block.get("text") or block.get("content") or ""))
    return "\n".join(texts)


def test_a_session_resumed_after_the_persons_answer_is_told_they_answered(ai_brain: Brain, api: FakeAnthropic) -> None:
    """An agent asks its own question; the person answers: the resumed session is told the person answered (with the
    question and the answer), not that it was interrupted by a retry or a restart."""
    brain = ai_brain
    ask = {"answer": {"signal": "ESCALATE", "question": "Ship the draft as it is?", "options": ["ship", "hold"]}}
    brain.write("agents/writer.md", ai_agent_md("writer", "You write.\n\n" + playbook(ask), runner=CLAUDE))
    brain.workflow("notes", for_each("notes", "writer", ["a"]))
    with brain.daemon():
        esc = _escalation(brain, "question")
        asked = len(api.requests)
        assert brain.decide(esc["id"], "ship").rc == 0
        # The resumed session asks again (its playbook always asks): by then the model has read the brief.
        brain.wait_escalation("the question asked again", where=lambda e: e["id"] != esc["id"], timeout=AI_WAIT)
    resumed = [_user_texts(r.body) for r in api.requests[asked:] if "Ship the draft" in json.dumps(r.body)]
    assert resumed, "no request to the model after the answer"
    brief = resumed[0]
    assert "the person answered" in brief and "Ship the draft as it is?" in brief and "ship" in brief, brief
    assert "interrupted" not in brief.lower(), brief


# ---------------------------------------------------------------- costs: what is recorded is what was billed
#
# The fake API writes every answer it sends in its billing ledger (``api.billed``); ambient writes each model call
# in the run's journal (a ``call`` event with the answer's id and usage) before the agent gets the answer. The tests
# compare the two call by call.

#: The fake's usage fields (the providers' names) → ambient's.
_TOKENS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_input_tokens": "cache_read_tokens",
    "cache_creation_input_tokens": "cache_write_tokens",
}


def _journal_events(brain: Brain, kind: str) -> list[dict[str, Any]]:
    """Every event of this kind in the brain's run journals, in order of each file."""
    out: list[dict[str, Any]] = []
    for path in sorted(brain.path(".ambient/runs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("ev") == kind:
                out.append(ev)
    return out


def _billed_tokens(usage: dict[str, Any]) -> dict[str, int]:
    return {ours: int(usage.get(theirs) or 0) for theirs, ours in _TOKENS.items()}


def _recorded_tokens(usage: dict[str, Any]) -> dict[str, int]:
    return {ours: int(usage.get(ours) or 0) for ours in _TOKENS.values()}


def _check_recorded_is_billed(brain: Brain, api: FakeAnthropic, *, lost_at_most: int = 0) -> list[dict[str, Any]]:
    """Every answer the fake billed is a ``call`` of a run journal with the same tokens and a cost, once; nothing is
    recorded that was not billed; at most ``lost_at_most`` billed answers are missing (answers the daemon was killed
    before it handed on). The calls."""
    calls = _journal_events(brain, "call")
    by_id: dict[str, dict[str, Any]] = {}
    for call in calls:
        assert call["id"] not in by_id, f"call {call['id']} recorded twice"
        by_id[call["id"]] = call
    billed = api.billed
    assert billed, "the fake billed nothing"
    assert set(by_id) <= {b.id for b in billed}, "a call recorded that the provider never billed"
    missing = [b.id for b in billed if b.id not in by_id]
    assert len(missing) <= lost_at_most, f"{len(missing)} of {len(billed)} billed answers not recorded: {missing}"
    for b in billed:
        if b.id in by_id:
            assert _recorded_tokens(by_id[b.id]["usage"]) == _billed_tokens(b.usage), b
            assert by_id[b.id]["usage"]["cost_usd"] > 0
    return calls


def _record_tokens(record: dict[str, Any]) -> dict[str, int]:
    return {ours: int(record.get(ours) or 0) for ours in _TOKENS.values()}


def _sum_tokens(usages: list[dict[str, int]]) -> dict[str, int]:
    return {ours: sum(u[ours] for u in usages) for ours in _TOKENS.values()}


def test_a_claude_agent_that_times_out_is_charged_every_call_it_made(ai_brain: Brain, api: FakeAnthropic) -> None:
    """An agent stopped at its timeout reports nothing itself, yet its turns were billed: the run records each of
    them, and its record's tokens and cost are what was billed."""
    brain = ai_brain
    command = f"{sys.executable} -c 'import time; time.sleep(60)'"
    _bash_agent(brain, command, allowed_tools=["Bash"], timeout_s=3)
    brain.workflow("stuck", _building("stuck", extra="  on_return:\n    error: [abort]\n"))
    with brain.daemon():
        [record] = brain.wait_finished("stuck", timeout=AI_WAIT)
    assert "ran over its timeout of 3 s" in record["steps"][0]["error"]
    calls = _check_recorded_is_billed(brain, api)
    assert _record_tokens(record) == _sum_tokens([_billed_tokens(b.usage) for b in api.billed])
    assert record["cost_usd"] == pytest.approx(sum(c["usage"]["cost_usd"] for c in calls), abs=1e-6)


def test_a_resumed_session_is_charged_only_its_own_calls(ai_brain: Brain, api: FakeAnthropic) -> None:
    """A session asks the person, is resumed with their answer and ends: each attempt is charged its own calls, so
    the run's tokens and cost are what was billed, not the session's running total counted again."""
    brain = ai_brain
    _bash_agent(brain, "echo built >> work/out/$ITEM.log")
    brain.workflow("build", _building("build"))
    with brain.daemon():
        esc = _escalation(brain, "permission")
        assert brain.decide(esc["id"], "allow").rc == 0
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    calls = _check_recorded_is_billed(brain, api)
    assert _record_tokens(record) == _sum_tokens([_billed_tokens(b.usage) for b in api.billed])
    assert record["cost_usd"] == pytest.approx(sum(c["usage"]["cost_usd"] for c in calls), abs=1e-6)
    steps = record["steps"]
    assert len(steps) == 2 and all(s["usage"]["cost_usd"] > 0 for s in steps), steps
    assert sum(s["usage"]["cost_usd"] for s in steps) == pytest.approx(record["cost_usd"], abs=1e-6)
    # `ambient stats --calls`: every call, one line each with its cost, as billed
    listed = brain.ok("stats", "--calls", "50", "--json").json()["calls"]
    assert len(listed) == len(api.billed) == len(calls), (listed, api.billed)
    assert sorted((c["input_tokens"], c["output_tokens"]) for c in listed) == sorted(
        (b.usage["input_tokens"], b.usage["output_tokens"]) for b in api.billed
    )
    assert sum(c["cost_usd"] for c in listed) == pytest.approx(record["cost_usd"], abs=1e-6)
    table = brain.ok("stats", "--calls").out
    assert "COST" in table and f"{len(listed)} call(s)" in table, table


def _busy_agent(brain: Brain, name: str, turns: int) -> None:
    """A Claude agent that runs ``turns`` allowed commands, one per model turn, then answers."""
    steps = [{"tool": "Bash", "input": {"command": f"echo {n}"}} for n in range(turns)]
    body = "You work.\n\n" + playbook(*steps, DONE)
    brain.write(f"agents/{name}.md", ai_agent_md(name, body, runner={**CLAUDE, "allowed_tools": ["Bash(echo:*)"]}))


def test_three_agents_at_once_near_the_budget_pass_it_by_no_more_than_their_calls_in_flight(
    ai_brain: Brain, api: FakeAnthropic
) -> None:
    """Three agents start together under a budget their first calls spend: every call after it is refused before it
    reaches the provider (the agents see an error), the run holds and asks once; what was billed is recorded, and
    each recorded call was let through while the run's recorded spend was under its budget."""
    brain = ai_brain
    budget = 0.0001
    brain.config(f"""
        concurrency: 3
        budget:
          per_run_usd: {budget}
    """)
    _busy_agent(brain, "worker", turns=4)
    brain.workflow("busy", for_each("busy", "worker", ["a", "b", "c"]))
    with brain.daemon():
        esc = _escalation(brain, "budget")
        assert "budget" in esc["question"]
        assert len([e for e in brain.escalations() if e["kind"] == "budget"]) == 1
        assert brain.decide(esc["id"], "abort").rc == 0
        [record] = brain.wait_finished("busy", timeout=AI_WAIT)
    assert record["outcome"] == "aborted"
    calls = _check_recorded_is_billed(brain, api)
    # Each call went out while the spend recorded before it was under the budget: the overshoot is the calls that
    # were in flight when it was reached, not whole sessions.
    for call in calls:
        before = sum(c["usage"]["cost_usd"] for c in calls if c["at"] < call["sent"])
        assert before < budget, (call, before)
    assert record["cost_usd"] == pytest.approx(sum(c["usage"]["cost_usd"] for c in calls), abs=1e-6)
    assert len(calls) < 3 * 4, "whole sessions ran past the budget"
    # `ambient stats`: the worker's calls by model, and those refused
    models = [m for m in brain.ok("stats", "--json").json()["models"] if m["agent"] == "worker"]
    assert sum(m["calls"] for m in models) == len(calls)
    assert sum(m["refused"] for m in models) >= 1
    assert "REFUSED" in brain.ok("stats").out


def test_kill_9_between_an_answer_and_its_record_loses_at_most_the_calls_in_flight(
    ai_brain: Brain, api: FakeAnthropic
) -> None:
    """kill -9 of the daemon right after the provider billed an answer (a seeded point of a session of several
    turns), then a start: the session resumes and ends; every billed answer is recorded but those in flight at each
    kill (which the agent never got), none twice, and the run's record adds up to its calls."""
    brain = ai_brain
    rng = random.Random(20261207)
    _busy_agent(brain, "worker", turns=4)
    kills = 2
    for n in range(kills):
        brain.workflow(f"busy{n}", for_each(f"busy{n}", "worker", ["a"]))
        before = len(api.billed)
        daemon = brain.daemon().start()
        try:
            api.wait_billed(before + rng.randint(3, 4), timeout=AI_WAIT)
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.proc.wait(timeout=30)  # type: ignore[union-attr]
        finally:
            daemon.kill()
        with brain.daemon():
            [record] = brain.wait_finished(f"busy{n}", timeout=AI_WAIT)
        assert record["outcome"] == "success", record
        calls = [c for c in _journal_events(brain, "call") if c["key"].startswith(record["run_id"] + "/")]
        assert record["cost_usd"] == pytest.approx(sum(c["usage"]["cost_usd"] for c in calls), abs=1e-6)
    # Calls in flight at a kill: the agent's turn and a side request of Claude Code's at most.
    _check_recorded_is_billed(brain, api, lost_at_most=2 * kills)
