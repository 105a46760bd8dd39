"""The console steers what the CLI steers: reset a tripped breaker, forget an AI agent's grant, pause/resume/abort a
claim, release a held lock. Each action over real HTTP against a real ``ambient web``: success writes what the CLI
would (checked with the CLI), a refusal reads like the CLI's and changes nothing."""

from __future__ import annotations

import httpx

from tests.acceptance.harness import Brain
from tests.web.conftest import Console
from tests.web.test_pages import _client, _notice


def _csrf(console: Console) -> str:
    """The CSRF secret of the console's sign-in (what every form of its pages carries)."""
    return console.csrf()


def _trip(brain: Brain, scope: str, times: int = 3) -> None:
    for _ in range(times):
        brain.cli("preflight", "fail", scope)


def test_a_tripped_breaker_is_reset_from_the_overview(brain: Brain, console: Console) -> None:
    _trip(brain, "work/")
    with _client(console) as http:
        page = http.get("/").text
        assert "work/" in page and "3 consecutive failure(s)" in page
        assert f'action="{console.root}/breakers/reset"' in page
        alone = http.get("/", params={"fragment": "breakers"}).text
        assert "<html" not in alone and 'name="scope" value="work/"' in alone
        form = {"scope": "work/", "csrf": _csrf(console), "back": "/"}
        text, level = _notice(http.post("/breakers/reset", data=form))
        assert (text, level) == ("work/: breaker reset", "ok")
        assert "No breaker tripped." in http.get("/").text
        text, level = _notice(http.post("/breakers/reset", data={"scope": " ", "csrf": _csrf(console)}))
        assert level == "error" and "say which breaker to reset" in text
    status = brain.cli("preflight", "status", "work/")
    assert status.rc == 0 and "closed" in status.out


def test_an_unreadable_breaker_file_is_said_and_refuses_a_reset(brain: Brain, console: Console) -> None:
    brain.write(".ambient/breaker.json", "{nope")
    with _client(console) as http:
        page = http.get("/").text
        assert "cannot be read" in page and "No breaker tripped." in page
        text, level = _notice(http.post("/breakers/reset", data={"scope": "work/", "csrf": _csrf(console)}))
        assert level == "error" and text.startswith("Refused, nothing changed:") and "cannot be read" in text
    assert brain.read(".ambient/breaker.json") == "{nope"


def test_a_reset_without_csrf_is_refused(brain: Brain, console: Console) -> None:
    _trip(brain, "work/")
    with _client(console) as http:
        res: httpx.Response = http.post("/breakers/reset", data={"scope": "work/"})
        assert res.status_code == 403
    assert brain.cli("preflight", "status", "work/").rc == 3


def _grant(brain: Brain, agent: str, *calls: str) -> None:
    from ambient.runners.claude import SessionStore
    from ambient.storage.paths import BrainPaths

    store = SessionStore(BrainPaths(brain.root).state / "claude")
    for call in calls:
        store.grant_always(agent, call)


def test_grants_are_listed_and_forgotten_from_the_matrix_page(brain: Brain, console: Console) -> None:
    _grant(brain, "coder", "Bash: pytest -q", "Edit: src/<b>x</b>.py")
    _grant(brain, "writer", "WebFetch: example.org")
    with _client(console) as http:
        page = http.get("/matrix").text
        assert "Bash: pytest -q" in page and "Edit: src/&lt;b&gt;x&lt;/b&gt;.py" in page and "<b>x" not in page
        assert f'action="{console.root}/grants/forget"' in page and "Forget all 2" in page
        alone = http.get("/matrix", params={"fragment": "grants"}).text
        assert "<html" not in alone and "WebFetch: example.org" in alone
        form = {"agent": "coder", "call": "Bash: pytest -q", "csrf": _csrf(console), "back": "/matrix"}
        text, level = _notice(http.post("/grants/forget", data=form))
        assert (text, level) == ("forgot 1 grant(s) of coder: asked again from the next call", "ok")
        text, level = _notice(http.post("/grants/forget", data=form))  # already forgotten: the CLI's words
        assert (text, level) == (
            "Refused, nothing changed: no such grant of coder; `ambient grants` lists them",
            "error",
        )
        text, level = _notice(http.post("/grants/forget", data={"agent": "writer", "csrf": _csrf(console)}))
        assert level == "ok" and text.startswith("forgot 1 grant(s) of writer")
        text, level = _notice(http.post("/grants/forget", data={"agent": " ", "csrf": _csrf(console)}))
        assert level == "error"
    assert brain.ok("grants", "--json").json() == {"coder": ["Edit: src/<b>x</b>.py"]}
    missing = brain.cli("grants", "forget", "coder", "Bash: pytest -q")
    assert missing.rc == 1 and "no such grant of coder; `ambient grants` lists them" in missing.err


def test_a_claim_offers_exactly_its_legal_gate_actions(brain: Brain, console: Console) -> None:
    brain.ok("claim", "open", "--sess-id", "c-1", "--type", "satellite", "--agent", "w", "--scope", "work/")
    csrf = _csrf(console)

    def buttons() -> list[str]:
        with _client(console) as http:
            page = http.get("/claims").text
        start = page.index(f'action="{console.root}/claims/c-1/gate"')
        form = page[start : page.index("</form>", start)]
        return [part.split('"', 1)[0] for part in form.split('name="action" value="')[1:]]

    assert buttons() == ["gate", "pause", "abort"]  # open
    with _client(console) as http:
        form = {"action": "pause", "message": "lunch", "csrf": csrf, "back": "/claims"}
        text, level = _notice(http.post("/claims/c-1/gate", data=form))
        assert (text, level) == ("c-1: open -> paused", "ok")
        assert buttons() == ["resume", "abort"]  # paused
        assert "<h2>Paused" in http.get("/claims").text
        text, level = _notice(http.post("/claims/c-1/gate", data=form))  # paused already: the CLI's refusal
        assert level == "error" and "cannot pause claim c-1: it is paused" in text
        text, level = _notice(http.post("/claims/c-1/gate", data={**form, "action": "resume", "message": ""}))
        assert (text, level) == ("c-1: paused -> open", "ok")
        text, level = _notice(http.post("/claims/c-1/gate", data={**form, "action": "abort", "message": "wrong"}))
        assert (text, level) == ("c-1: open -> failed", "ok")
        assert f'action="{console.root}/claims/c-1/gate"' not in http.get("/claims").text  # failed: nothing is legal
        text, level = _notice(http.post("/claims/c-1/gate", data={**form, "action": "close"}))
        assert level == "error" and "unknown action 'close'" in text
    status = brain.ok("gate", "status", "c-1", "--json").json()
    assert [(h["action"], h.get("message")) for h in status["gate_history"]] == [
        ("pause", "lunch"),
        ("resume", None),
        ("abort", "wrong"),
    ]


def test_abort_on_a_runs_claim_from_the_console_aborts_the_run(brain: Brain, console: Console) -> None:
    """The console's Abort on a run's claim is `ambient gate abort`: the run is aborted (here with no daemon
    running: when it starts), its question cancelled saying the console did it, and its claims end failed."""
    brain.python_agent("deploy", "import json, sys\njson.load(sys.stdin)\nsys.exit(1)\n")
    brain.workflow("rollout", "workflow: rollout\nfor_each: {items: [eu-1], spawn: deploy}\n")
    brain.until_idle()
    [esc] = brain.escalations()
    [run] = brain.status()["runs"]
    run_id = run["run_id"]
    with _client(console) as http:
        form = {"action": "abort", "message": "called off", "csrf": _csrf(console), "back": "/claims"}
        text, level = _notice(http.post(f"/claims/{run_id}/gate", data=form))
    assert level == "ok" and text.startswith(f"{run_id}: abort handed to its run as ABORT"), text
    assert "applied when the daemon starts" in text
    brain.until_idle()
    [record] = brain.finished("rollout")
    assert record["outcome"] == "aborted", record
    [cancelled] = [e for e in brain.escalations(all=True) if e["id"] == esc["id"]]
    assert cancelled["status"] == "cancelled" and "called off (the console" in cancelled["note"], cancelled
    assert brain.ok("gate", "status", run_id).out.startswith(f"{run_id}: failed")


def test_a_lock_is_released_from_the_claims_page_unless_it_changed_hands(brain: Brain, console: Console) -> None:
    brain.ok("lock", "acquire", "work/a.txt", "sess-1", "--ttl", "5")
    csrf = _csrf(console)
    with _client(console) as http:
        page = http.get("/claims").text
        assert f'action="{console.root}/locks/release"' in page and 'name="holder" value="sess-1"' in page
        alone = http.get("/claims", params={"fragment": "locks"}).text
        assert "<html" not in alone and "Release work/a.txt held by sess-1" in alone
        token = alone.split('name="token" value="', 1)[1].split('"', 1)[0]
        form = {"file": "work/a.txt", "holder": "sess-1", "token": token, "csrf": csrf, "back": "/claims"}
        # meanwhile the lock is released and taken by another session: the page's button is refused
        brain.ok("lock", "release", "work/a.txt", "sess-1")
        brain.ok("lock", "acquire", "work/a.txt", "sess-2", "--ttl", "5")
        text, level = _notice(http.post("/locks/release", data=form))
        assert level == "error" and "work/a.txt is held by sess-2, not by sess-1; release refused" in text
        cli = brain.cli("lock", "release", "work/a.txt", "sess-1")
        assert cli.rc == 2 and "work/a.txt is held by sess-2, not by sess-1; release refused" in cli.err
        text, level = _notice(http.post("/locks/release", data={**form, "holder": "sess-2", "token": "x"}))
        assert level == "error" and "not a number" in text
        text, level = _notice(http.post("/locks/release", data={**form, "holder": "sess-2", "token": ""}))
        assert (text, level) == ("released work/a.txt", "ok")
        assert "No lock is held." in http.get("/claims", params={"fragment": "locks"}).text
        text, level = _notice(http.post("/locks/release", data={**form, "holder": "sess-2", "token": ""}))
        assert level == "error" and "work/a.txt is not locked" in text
    assert brain.cli("lock", "check", "work/a.txt").rc == 0
