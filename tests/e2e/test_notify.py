"""End to end through the real daemon: a failing item is escalated, notified (apprise json:// and a fake
Telegram Bot API on 127.0.0.1), answered from the CLI or a Telegram button, and the run completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import EXAMPLE_BRAIN, wait_until
from tests.e2e.helpers import TEST_AGENT_ENV

CANARY = "CANARYtok3n-9f8e7d6c5b4a"  # a unique secret: it must never appear in any output or file
BOT_TOKEN = "123456789:AAH-canaryBotToken_abcdefghijklmnopqrstu"


class Recorder(BaseHTTPRequestHandler):
    """A fake HTTP endpoint: apprise json:// posts and the Telegram Bot API methods ambient uses."""

    server: Any

    def log_message(self, *args: Any) -> None:
        return None

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"raw": raw.decode(errors="replace")}
        st = self.server.state
        with st["lock"]:
            st["posts"].append((self.path, body, dict(self.headers)))
            fail = st["fail_first"] > 0
            if fail:
                st["fail_first"] -= 1
        if fail:
            self._reply(500, {"ok": False})
            return
        method = self.path.rsplit("/", 1)[-1]
        if method == "sendMessage":
            with st["lock"]:
                st["messages"].append(body)
            self._reply(
                200,
                {
                    "ok": True,
                    "result": {
                        "message_id": len(st["messages"]),
                        "chat": {"id": body.get("chat_id")},
                        "text": body.get("text", ""),
                    },
                },
            )
        elif method == "getUpdates":
            with st["lock"]:
                updates = [u for u in st["updates"] if u["update_id"] >= int(body.get("offset") or 0)]
            if not updates:
                st["polled"].set()
            self._reply(200, {"ok": True, "result": updates})
        elif method in ("answerCallbackQuery", "editMessageText"):
            with st["lock"]:
                st["calls"].append((method, body))
            self._reply(200, {"ok": True, "result": True})
        else:
            self._reply(200, {"ok": True})


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A local HTTP server on 127.0.0.1 recording every request."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    state: dict[str, Any] = {
        "lock": threading.Lock(),
        "posts": [],
        "messages": [],
        "updates": [],
        "calls": [],
        "fail_first": 0,
        "polled": threading.Event(),
    }
    server.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def _brain(tmp_path: Path, config: str) -> Path:
    root = tmp_path / "brain"
    shutil.copytree(EXAMPLE_BRAIN, root)
    for wf in ("feature-chain.yml", "docs-refresh.yml"):
        (root / "workflows" / wf).unlink()
    (root / "profil" / "ambient.yml").write_text(config)
    return root


def _run(root: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ambient",
            "run",
            "--brain",
            str(root),
            "--until-idle",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env.update(TEST_AGENT_ENV)
    env.update(extra)
    return env


def _all_text(root: Path, *outputs: str) -> str:
    parts = list(outputs)
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            parts.append(p.read_text(errors="replace"))
    return "\n".join(parts)


def _pending(root: Path) -> list[dict[str, Any]]:
    from ambient.human.escalation_store import EscalationStore

    return [e.model_dump(mode="json") for e in EscalationStore(BrainPaths(root)).list(status="pending")]


def test_fail_notify_decide_retry_completes(
    tmp_path: Path, http_server: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """instance-07 fails → escalation notified to json:// (a 500, then retried) → decide retry → 10/10, 1 escalation."""
    addr, state = http_server
    state["fail_first"] = 1  # the first send fails: the outbox retries it with backoff
    root = _brain(tmp_path, "notify:\n  retry_base_s: 0.05\n  retry_cap_s: 0.2\n  results: all\n")
    env = _env(AMBIENT_NOTIFY_URLS=f"json://user:{CANARY}@{addr}/hook")
    first = _run(root, env)
    assert first.returncode == 0, first.stderr[-2000:]
    pending = _pending(root)
    assert len(pending) == 1 and pending[0]["item"] == "instance-07"
    esc_id = pending[0]["id"]
    # Persisted before notifying, and delivered after one failed attempt (or still due: wait for it).
    assert wait_until(lambda: any("instance-07" in json.dumps(b) for p, b, _ in state["posts"]), 10)
    bodies = [b for _, b, _ in state["posts"]]
    escalation_posts = [b for b in bodies if esc_id in json.dumps(b)]
    assert escalation_posts, bodies
    message = escalation_posts[-1]["message"]
    assert "1. retry" in message and f"ambient decide {esc_id}" in message
    assert len(state["posts"]) >= 2  # the 500, then the retry that got through
    capsys.readouterr()
    assert main(["--brain", str(root), "decide", esc_id, "retry", "--note", "flaky health check"]) == 0
    second = _run(root, env)
    assert second.returncode == 0, second.stderr[-2000:]
    runs = read_jsonl(BrainPaths(root).runs_log).records
    assert len(runs) == 1
    rec = runs[0]
    assert rec["outcome"] == "success" and rec["escalations"] == 1
    assert rec["decisions"][0]["option"] == "retry" and rec["decisions"][0]["channel"] == "cli"
    assert sum(1 for s in rec["steps"] if s["item"] == "instance-07") == 2
    assert _pending(root) == []
    # S-06: the secret in the URL appears nowhere: daemon output, brain files, escalation files, records.
    assert CANARY not in _all_text(root, first.stdout, first.stderr, second.stdout, second.stderr)


def test_telegram_button_press_decides_and_resumes(tmp_path: Path, http_server: tuple[str, dict[str, Any]]) -> None:
    """The escalation goes to a fake Bot API with one button per option; a press becomes the decision."""
    addr, state = http_server
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text(BOT_TOKEN)
    cfg = (
        f"telegram:\n  answers: true\n  chat_id: '4242'\n  api_base: http://{addr}\n  poll_timeout_s: 0\n"
        "notify:\n  retry_base_s: 0.05\n  retry_cap_s: 0.2\n"
    )
    root = _brain(tmp_path, cfg)
    env = _env(CREDENTIALS_DIRECTORY=str(creds))
    first = _run(root, env)
    assert first.returncode == 0, first.stderr[-2000:]
    pending = _pending(root)
    assert len(pending) == 1
    esc = pending[0]
    # The daemon stopped once idle; start it in the background and press the button while it polls.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ambient", "run", "--brain", str(root), "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: bool(state["messages"]), 20), "no sendMessage reached the fake Bot API"
        msg = state["messages"][-1]
        assert str(msg["chat_id"]) == "4242" and "instance-07" in msg["text"]
        buttons = [b for row in msg["reply_markup"]["inline_keyboard"] for b in row]
        assert [b["text"] for b in buttons][:3] == ["1. retry", "2. skip", "3. abort"]
        data = buttons[0]["callback_data"]
        forged = data.rsplit(":", 1)[0] + ":forgednonce0000000000"
        with state["lock"]:
            state["updates"].extend(
                [
                    {
                        "update_id": 10,
                        "callback_query": {
                            "id": "q1",
                            "data": forged,
                            "from": {"id": 7, "first_name": "Eve"},
                            "message": {"message_id": 1, "chat": {"id": 4242}, "text": "x"},
                        },
                    },
                    {
                        "update_id": 11,
                        "callback_query": {
                            "id": "q2",
                            "data": data,
                            "from": {"id": 7, "first_name": "Ana"},
                            "message": {"message_id": 1, "chat": {"id": 4242}, "text": "x"},
                        },
                    },
                ]
            )
        runs_log = BrainPaths(root).runs_log
        assert wait_until(lambda: runs_log.exists() and bool(read_jsonl(runs_log).records), 30)
        rec = read_jsonl(runs_log).records[0]
        assert rec["outcome"] == "success" and rec["decisions"][0]["channel"] == "telegram"
        answered = [b for m, b in state["calls"] if m == "answerCallbackQuery"]
        assert len(answered) == 2  # the forged press is answered (refused) and acts on nothing
        edits = [b for m, b in state["calls"] if m == "editMessageText"]
        assert any("retry" in e.get("text", "") and "Ana" in e.get("text", "") for e in edits)
    finally:
        os.killpg(proc.pid, 15)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert esc["id"]
    assert BOT_TOKEN not in _all_text(root, first.stdout, first.stderr, out, err)


def test_learned_rule_decides_alone_after_opt_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Answers become a shadow rule, agreements promote it, and once opted in it decides alone, never silently."""
    root = _brain(tmp_path, "notify:\n  results: none\n")
    paths = BrainPaths(root)
    paths.state.mkdir(parents=True, exist_ok=True)
    (paths.state / "rules.yml").write_text("version: 1\npromote_after: 1\nauto_decide:\n  global: true\n")
    env = _env()

    def one_run(decide: bool) -> dict[str, Any]:
        res = _run(root, env)
        assert res.returncode == 0, res.stderr[-2000:]
        for esc in _pending(root):
            assert decide, "a rule should have decided this one"
            assert main(["--brain", str(root), "decide", esc["id"], "retry"]) == 0
            res = _run(root, env)
            assert res.returncode == 0, res.stderr[-2000:]
        return read_jsonl(paths.runs_log).records[-1]

    first = one_run(decide=True)  # a candidate rule is born in shadow
    assert first["decisions"][0]["auto"] is False
    assert main(["--brain", str(root), "start", "deploy-batch"]) == 0
    second = one_run(decide=True)  # the same answer: one agreement → active (promote_after: 1)
    assert second["run_id"] != first["run_id"]
    capsys.readouterr()
    assert main(["--brain", str(root), "rules", "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)
    rule_list = rules["rules"] if isinstance(rules, dict) else rules
    assert rule_list[0]["state"] == "active" and rule_list[0]["option"] == "retry"
    assert main(["--brain", str(root), "start", "deploy-batch"]) == 0
    third = one_run(decide=False)  # the rule decides: no escalation left for the person
    assert third["outcome"] == "success"
    assert third["decisions"][0]["auto"] is True and third["decisions"][0]["channel"] == "rule", third["decisions"]
    outbox = list((paths.state / "outbox").glob("*.json")) if (paths.state / "outbox").exists() else []
    del outbox  # no notifier configured: the information is logged and recorded in the run
