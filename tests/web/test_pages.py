"""The run, workflows, learning, matrix and claims pages over real HTTP against a real ``ambient web``: every page
answers 200 with the token, every live part renders alone, strings from the brain's files (a workflow, a claim, an
item's error, a run record) stay text, and the pages' actions (a gate, a rule, a start) change what the CLI would
and answer with a notice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.acceptance.harness import Brain, agent_md
from tests.web.conftest import Console, start_console

XSS = "<script>alert('pwned')</script>"
RUN_ID = "sess-20260316-2036-batch-0001"


def _client(console: Console) -> httpx.Client:
    # Its POSTs say where they come from, as a browser's do (Origin: the console's): the console refuses those that
    # do not.
    return httpx.Client(
        base_url=console.base,
        cookies=console.cookies(),
        headers={"Origin": console.origin},
        follow_redirects=False,
        timeout=20,
    )


def _csrf(page: str) -> str:
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


def _notice(res: httpx.Response) -> tuple[str, str]:
    assert res.status_code == 303, res.text
    query = parse_qs(urlsplit(res.headers["location"]).query)
    return query["notice"][0], query["level"][0]


def _journal(brain: Brain) -> None:
    """A for_each run of two items: one failed with a hostile error, one still running (the daemon is not needed:
    the page reads the files)."""
    spec = {"name": "batch", "for_each": {"items": ["a", "b"], "spawn": "w"}}
    events: list[dict[str, Any]] = [
        {"ev": "started", "run_id": RUN_ID, "workflow": "batch", "form": "for_each", "spec_hash": None,
         "spec": spec, "items": ["a", XSS], "mode": "assisted", "trigger": "file", "context": {"why": XSS},
         "at": "2026-03-16T20:36:00+00:00"},
        {"ev": "accepted", "item": "a", "attempt": 1, "key": f"{RUN_ID}/a/1", "at": "2026-03-16T20:36:01+00:00"},
        {"ev": "accepted", "item": XSS, "attempt": 1, "key": f"{RUN_ID}/x/1", "at": "2026-03-16T20:36:02+00:00"},
        {"ev": "finished", "item": "a", "attempt": 1, "agent": "w", "key": f"{RUN_ID}/a/1", "result": "error",
         "error": f"crashed: {XSS}", "duration_ms": 1500, "at": "2026-03-16T20:36:03+00:00"},
    ]  # fmt: skip
    brain.write(f".ambient/runs/{RUN_ID}.jsonl", "".join(json.dumps(e) + "\n" for e in events))
    record = {
        "run_id": "sess-old",
        "workflow": "batch",
        "outcome": "failed",
        "started_at": "2026-03-09T10:00:00+00:00",
        "completed_at": "2026-03-09T10:05:00+00:00",
        "duration_ms": 300000,
        "steps": [{"item": "a", "agent": "w", "signal_out": "SPAWN", "result": "error", "duration_ms": 5,
                   "attempt": 1, "error": f"boom {XSS}", "at": "2026-03-09T10:04:00+00:00"}],
        "escalations": 1,
        "errors": 1,
        "decisions": [],
    }  # fmt: skip
    brain.write(".ambient/runs.jsonl", json.dumps(record) + "\n")


@pytest.fixture
def hostile(brain: Brain) -> Brain:
    """A brain whose files carry HTML: a workflow's description, a broken workflow, a claim, a run's errors."""
    brain.write("agents/w.md", agent_md("w", ["true"]))
    brain.workflow(
        "batch",
        f"""
        workflow: batch
        description: "{XSS}"
        status: draft
        for_each:
          items: [a, b]
          spawn: w
          scope: {{zone: project, files: ["work/{{{{index}}}}.txt"]}}
        """,
    )
    brain.workflow(
        "review",
        """
        workflow: review
        status: draft
        chain:
          - {step: 1, type: code, scope: work/, agents: [w]}
          - {step: 2, type: deploy, scope: work/, agents: [w], gate: human}
        """,
    )
    brain.workflow("broken", f'workflow: broken\nfor_each: {{items: [a], spawn: "{XSS}"}}\n')
    brain.ok("claim", "open", "--sess-id", "c-1", "--type", "satellite", "--agent", "w", "--scope", "work/",
             "--workflow", XSS)  # fmt: skip
    _journal(brain)
    return brain


@pytest.fixture
def hostile_console(hostile: Brain) -> Any:
    c = start_console(hostile)
    try:
        yield c
    finally:
        c.stop()


PAGES = ("/", "/escalations", "/workflows", "/learning", "/matrix", "/claims", f"/runs/{RUN_ID}")


def test_every_page_answers_and_keeps_file_strings_as_text(hostile_console: Console) -> None:
    with _client(hostile_console) as http:
        for path in PAGES:
            res = http.get(path)
            assert res.status_code == 200, (path, res.text[-2000:])
            assert XSS not in res.text, path
            assert "onerror" not in res.text and "style=" not in res.text, path
        escaped = "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"
        for path in ("/workflows", "/claims", f"/runs/{RUN_ID}", "/learning"):
            assert escaped in http.get(path).text, path
        missing = http.get("/runs/sess-nope")
        assert missing.status_code == 404 and "No run sess-nope" in missing.text


def test_the_run_page_shows_the_grid_the_timeline_and_the_errors(hostile_console: Console) -> None:
    with _client(hostile_console) as http:
        page = http.get(f"/runs/{RUN_ID}").text
        assert page.count('role="listitem" class="cell st-') == 2  # one cell per item
        assert 'listitem" class="cell st-failed"' in page and 'listitem" class="cell st-running"' in page
        assert "a: failed, attempt 1, 1.5 s" in page  # the hover text
        assert page.count('<rect class="tl-') == 2  # a timeline bar per started item
        assert "at most 2 at once" in page
        assert "crashed: &lt;script&gt;" in page
        assert 'data-live="run:' + RUN_ID + '"' in page


@pytest.mark.parametrize(
    ("path", "fragments"),
    [
        (f"/runs/{RUN_ID}", ("progress", "questions", "timeline", "details", "record")),
        ("/claims", ("summary", "waiting", "stale", "locks", "open")),
        ("/learning", ("charts", "errors", "models")),
    ],
)
def test_each_live_part_renders_alone(hostile_console: Console, path: str, fragments: tuple[str, ...]) -> None:
    with _client(hostile_console) as http:
        for fragment in fragments:
            res = http.get(path, params={"fragment": fragment})
            assert res.status_code == 200 and "<html" not in res.text, (path, fragment, res.text[-500:])
            assert XSS not in res.text


def test_workflows_list_problems_and_start_a_run(hostile: Brain, hostile_console: Console) -> None:
    with _client(hostile_console) as http:
        page = http.get("/workflows").text
        assert "workflows/broken.yml:" in page  # file:line: message, as `ambient validate`
        assert "never by itself (draft)" in page and "1 → 2" in page
        csrf = _csrf(page)
        bad = http.post("/workflows/review/start", data={"context": "{nope", "csrf": csrf, "back": "/workflows"})
        text, level = _notice(bad)
        assert level == "error" and "not valid JSON" in text and "review not started" in text
        # The page comes back with the form open at that workflow and what was typed in it (a new user lost it).
        assert urlsplit(bad.headers["location"]).fragment == "wf-review"
        again = http.get(hostile_console.origin + bad.headers["location"]).text
        card = again[again.index('id="wf-review"') :]
        assert '<details class="start" open>' in card[: card.index("</form>")]
        assert ">{nope</textarea>" in card
        unknown = http.post("/workflows/review/start", data={"step": "9", "csrf": csrf, "back": "/workflows"})
        text, level = _notice(unknown)
        assert level == "error" and "has no step '9'" in text
        assert not list(hostile.path(".ambient/inbox").glob("*.json"))
        ok = http.post(
            "/workflows/review/start",
            data={"step": "2", "context": '{"ticket": "T-1"}', "csrf": csrf, "back": "/workflows"},
        )
        text, level = _notice(ok)
        assert level == "ok" and "start requested: review" in text
    [packet] = hostile.path(".ambient/inbox").glob("*.json")
    assert "T-1" in packet.read_text()


def test_a_waiting_claim_is_approved_from_the_claims_page(hostile: Brain, hostile_console: Console) -> None:
    hostile.ok("gate", "gate", "c-1", "ship it?")
    with _client(hostile_console) as http:
        page = http.get("/claims").text
        assert f'action="{hostile_console.root}/claims/c-1/gate"' in page
        res = http.post(
            "/claims/c-1/gate", data={"action": "approve", "message": "yes", "csrf": _csrf(page), "back": "/claims"}
        )
        text, level = _notice(res)
        assert (text, level) == ("c-1: waiting_human -> open", "ok")
        again = http.post("/claims/c-1/gate", data={"action": "approve", "csrf": _csrf(page), "back": "/claims"})
        text, level = _notice(again)
        assert level == "error" and "cannot approve claim c-1: it is open" in text
    status = hostile.ok("gate", "status", "c-1", "--json").json()
    assert [h["action"] for h in status["gate_history"]] == ["gate", "approve"]


def test_rules_are_accepted_forgotten_and_opted_in(hostile: Brain, hostile_console: Console) -> None:
    from datetime import UTC, datetime

    from ambient.learning.rules import RuleBook, observe, situation_from_step
    from ambient.learning.rulestore import rules_path, save_rules
    from ambient.storage.paths import BrainPaths

    step = {"item": "a", "agent": "w", "result": "fail", "error": f"exit 1 {XSS}", "signal_in": "RETURN"}
    rules: list[Any] = []
    for i in range(4):
        rules = observe(rules, situation_from_step("batch", step), "retry", f"run-{i}", datetime.now(UTC))
    save_rules(rules_path(BrainPaths(hostile.root)), RuleBook().with_rules(rules))
    rid = rules[0].id
    with _client(hostile_console) as http:
        page = http.get("/learning").text
        assert rid in page and XSS not in page
        csrf = _csrf(page)
        text, level = _notice(http.post(f"/rules/{rid}/accept", data={"csrf": csrf, "back": "/learning"}))
        assert level == "ok" and f"rule {rid} accepted: it now decides 'retry' alone" in text
        assert "decides alone" in http.get("/learning").text
        text, level = _notice(http.post("/rules/optin", data={"csrf": csrf, "workflow": "batch", "on": "1"}))
        assert level == "ok" and "on in batch" in text
        text, level = _notice(http.post(f"/rules/{rid}/forget", data={"csrf": csrf}))
        assert level == "ok" and "forgotten" in text
        text, level = _notice(http.post("/rules/r-nope/forget", data={"csrf": csrf}))
        assert level == "error" and "no rule with id 'r-nope'" in text
    listed = hostile.ok("rules", "--json").json()
    assert listed["rules"][0]["state"] == "forgotten" and listed["auto_decide"]["workflows"] == ["batch"]


def test_matrix_explain_gives_the_cli_verdict(hostile: Brain, hostile_console: Console) -> None:
    with _client(hostile_console) as http:
        page = http.get("/matrix", params={"from": "w", "to": "human", "signal": "ESCALATE"}).text
        cli = hostile.cli("matrix", "explain", "w", "human", "ESCALATE", "--json").json()
        assert cli["allowed"] and "ALLOW</strong> by rule <code>" + cli["rule"] + "</code>" in page
        denied = http.get("/matrix", params={"from": "w", "to": "bsi", "signal": "SPAWN"}).text
        assert "DENY</strong>" in denied
        bad = http.get("/matrix", params={"from": "w", "to": "human", "signal": "SPAWN", "files": "../x"}).text
        assert "Bad input:" in bad
        assert "<strong>w</strong>" in page  # the sends table lists the agent


def test_the_matrix_page_says_what_each_agent_may_reach_as_the_cli_does(
    hostile: Brain, hostile_console: Console
) -> None:
    runner = {"confine": True, "network": ["127.0.0.1:8080"]}
    hostile.write("agents/fetcher.md", agent_md("fetcher", ["true"], runner=runner))
    principals = {p["name"]: p for p in hostile.ok("matrix", "--json").json()["principals"]}
    assert principals["fetcher"]["network"] == "127.0.0.1:8080; binds no port"
    assert principals["w"]["network"] == "any (unconfined: confine: false)"
    with _client(hostile_console) as http:
        page = http.get("/matrix").text
    assert '<td data-label="may connect to" class="mono">127.0.0.1:8080; binds no port</td>' in page, page[-3000:]
    assert "any (unconfined: confine: false)" in page


def test_a_thousand_item_run_page_is_compact(tmp_path: Path, brain: Brain) -> None:
    """1,000 items: one small cell each, a bounded timeline, items listed in detail capped, the record abridged on the
    page and whole at ``record.json`` (behind the token, as every page)."""
    items = [f"i{n:04d}" for n in range(1000)]
    events: list[dict[str, Any]] = [
        {"ev": "started", "run_id": "sess-big", "workflow": "big", "form": "for_each", "spec_hash": None,
         "spec": {"name": "big"}, "items": items, "mode": "assisted", "trigger": "file", "context": {},
         "at": "2026-03-16T20:00:00+00:00"},
    ]  # fmt: skip
    steps = []
    for n, item in enumerate(items):
        start = f"2026-03-16T20:{n // 60 % 60:02d}:{n % 60:02d}+00:00"
        events.append({"ev": "accepted", "item": item, "attempt": 1, "key": f"sess-big/{item}/1", "at": start})
        result = "success" if n % 3 else "error"
        events.append({"ev": "finished", "item": item, "attempt": 1, "agent": "w", "key": f"sess-big/{item}/1",
                       "result": result, "error": None if n % 3 else f"e{n} {XSS}", "duration_ms": 900,
                       "at": start})  # fmt: skip
        steps.append({"item": item, "agent": "w", "result": result, "error": f"e{n} {XSS}"})
    events.append({"ev": "finished_run", "outcome": "partial", "at": "2026-03-16T21:00:00+00:00"})
    brain.write(".ambient/runs/sess-big.jsonl", "".join(json.dumps(e) + "\n" for e in events))
    record = {"run_id": "sess-big", "workflow": "big", "outcome": "partial", "started_at": "2026-03-16T20:00:00+00:00",
              "completed_at": "2026-03-16T21:00:00+00:00", "steps": steps, "errors": 334}  # fmt: skip
    brain.write(".ambient/runs.jsonl", json.dumps(record) + "\n")
    console = start_console(brain)
    try:
        with _client(console) as http:
            page = http.get("/runs/sess-big").text
            again = http.get("/runs/sess-big", params={"fragment": "details"}).text  # the journal kept: the same
            whole = http.get("/runs/sess-big/record.json")
            unfinished = http.get("/runs/sess-nope/record.json")
        with httpx.Client(base_url=console.base, timeout=20) as stranger:
            refused = stranger.get("/runs/sess-big/record.json")
    finally:
        console.stop()
    assert page.count('role="listitem" class="cell st-') == 1000
    # a hover title on the notable bars (334 failed here, capped), the rest one path per state (done, failed)
    assert page.count('<rect class="tl-') == 100
    assert page.count('<path class="tl-') == 2 and "1000 item(s) over" in page
    assert page.count('<details class="item"') == 60
    assert again.count('<details class="item"') == 60 and again in page
    assert "… 995 more: see record.json" in page and f'href="{console.root}/runs/sess-big/record.json"' in page
    assert XSS not in page
    assert len(page) < 600_000
    assert whole.status_code == 200 and whole.headers["content-type"].startswith("application/json")
    assert whole.headers["x-content-type-options"] == "nosniff"
    assert json.loads(whole.text) == record
    assert unfinished.status_code == 404 and "No record of run sess-nope" in unfinished.text
    assert refused.status_code == 401 and "steps" not in refused.text


def test_a_question_card_shows_what_a_learned_rule_would_choose(hostile: Brain, hostile_console: Console) -> None:
    """The console's question cards (the overview, the escalations page, the run page) carry the learned rule's
    prediction, the same line as the message and `ambient escalations`."""
    from datetime import UTC, datetime

    from ambient.human.escalation_store import EscalationStore
    from ambient.human.escalations import EscalationDraft, new_escalation
    from ambient.learning.rules import RuleBook, observe
    from ambient.learning.rulestore import escalation_situation, rules_path, save_rules
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(hostile.root)
    esc = new_escalation(
        EscalationDraft(
            workflow="batch",
            run_id=RUN_ID,
            kind="fail",
            question="w failed on a: agent exited with code 1: connection to 10.0.0.3 timed out after 31s",
            options=[("retry", "Run the item again", "retry"), ("skip", "Skip this item and go on", "skip")],
            item="a",
            agent="w",
            detail="agent exited with code 1: connection to 10.0.0.3 timed out after 31s",
        ),
        now=datetime.now(UTC),
    )
    EscalationStore(paths).create(esc)
    rules = observe([], escalation_situation(esc), "skip", "run-0", datetime.now(UTC))
    save_rules(rules_path(paths), RuleBook().with_rules(rules))
    line = f"learned rule {rules[0].id} would choose &#39;skip&#39; (in shadow, 0/3 agreements)"
    with _client(hostile_console) as http:
        for path in ("/", "/escalations", f"/runs/{RUN_ID}"):
            assert line in http.get(path).text, path


def test_a_pattern_grant_is_listed_and_forgotten_on_the_matrix_page(hostile: Brain, hostile_console: Console) -> None:
    """A command pattern the person accepted is listed among the grants as `ambient grants` lists it, and forgotten
    by its button as `ambient grants forget` forgets it."""
    from ambient.runners.claude import SessionStore

    store = SessionStore(hostile.path(".ambient/claude"))
    store.grant_pattern("coder", "pytest -q tests/*")
    store.grant_always("coder", "Bash: make")
    with _client(hostile_console) as http:
        page = http.get("/matrix").text
        assert '<td data-label="call" class="mono">Bash pattern: pytest -q tests/*</td>' in page, page[-4000:]
        assert "allow-pattern" in page  # the card says where patterns come from
        res = http.post(
            "/grants/forget",
            data={"agent": "coder", "call": "Bash pattern: pytest -q tests/*", "csrf": _csrf(page), "back": "/matrix"},
        )
        assert _notice(res) == ("forgot 1 grant(s) of coder: asked again from the next call", "ok")
    assert hostile.ok("grants").out.strip() == "coder  Bash: make"


def test_the_learning_page_shows_the_model_calls_per_agent_and_model(brain: Brain) -> None:
    """The model gateway's view in the console: each agent's calls on each model, their tokens, cost and the calls
    refused for a budget, as `ambient stats` counts them."""
    record = {
        "run_id": "sess-ai",
        "workflow": "review",
        "outcome": "success",
        "started_at": "2026-03-16T20:00:00+00:00",
        "completed_at": "2026-03-16T20:01:00+00:00",
        "steps": [{"item": "a", "agent": "writer", "result": "success", "duration_ms": 900}],
        "escalations": 0,
        "errors": 0,
        "calls_by": [
            {"agent": "writer", "model": "claude-haiku-4-5", "calls": 3, "input_tokens": 1200, "output_tokens": 90,
             "cost_usd": 0.0123, "refused": 2},
        ],
    }  # fmt: skip
    brain.write(".ambient/runs.jsonl", json.dumps(record) + "\n")
    console = start_console(brain)
    try:
        with _client(console) as http:
            page = http.get("/learning").text
            part = http.get("/learning", params={"fragment": "models"}).text
    finally:
        console.stop()
    for text in ("Model calls", "writer", "claude-haiku-4-5", "$0.0123", ">1200<", ">2<"):
        assert text in page, text
    assert "claude-haiku-4-5" in part and "<html" not in part
