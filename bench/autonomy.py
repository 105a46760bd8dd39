"""The learning loop over a simulated month: how many questions still reach the person, week after week.

A fresh ``ambient init`` brain, the real daemon as a process, agents as real programs (small Python scripts that fail
with a stated error: ``{"status": "failed", "error": "..."}``), 30 simulated days of a nightly for_each, a weekday
deploy and a weekday release chain with a human gate. Time is the clock ambient reads (``bench/simclock.py``: the
daemon and every command run on a clock the bench moves from one simulated day to the next), never a sleep.

A scripted person answers every question that reaches them (a notification on a loopback webhook) with
``ambient decide``, as an oracle that knows the right answer to each: retry a transient failure, skip a known-flaky
item, abort a conflicting migration, approve the release; a few situations are answered inconsistently (the person
looks at something the agent did not say); novel failures appear mid-month (weeks 2 and 3) and recur. Once
``ambient rules`` lists an active rule that does not decide alone yet, the person reads it (its situation and
option) and accepts it (``ambient rules accept ID``) only if that option is what they answer every time the
situation happens; a rule for a situation they answer by judgement they decline (``ambient rules forget ID``).
Reading the notice of an automatic decision they would not have taken, they forget its rule too. ``--claude`` adds
a Claude agent (the real Claude Code CLI against ambient.testing.fakeapi) whose Bash calls ask permission, one the
same every day, one with the day's arguments.

Printed per ISO week: questions that reached the person, automatic decisions, WRONG automatic decisions (against the
oracle, per occurrence), tool permissions asked (apart), the most automatic decisions a rule took on one item of
one run, the proposed rules the person declined; then the reduction week 1 → week 4 (docs/learning-loop.md,
"Measuring the loop", says how to read them). Targets: week 4 asks ≤ 10 % of week 1, 0 wrong automatic decisions,
every novel failure reaches the person the first time, no item decided alone more than ``learning.auto_repeats``
times. Exit 1 when a target is missed.

    python bench/autonomy.py [--days 30] [--seed 7] [--claude] [--stats] [--json out.json] [--keep --dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import TempDir  # noqa: E402
from simclock import set_clock  # noqa: E402

#: Monday of ISO week 2026-W02: day 0 of the simulated month.
START = datetime(2026, 1, 5, tzinfo=UTC)
AUTO_REPEATS = 3  # learning.auto_repeats, as written in the brain's profil/ambient.yml
BACKOFF_S = 0.2  # learning.backoff_s: short, so that a bounded rule's three tries take a second, not 35 s


@dataclass(frozen=True)
class Calendar:
    """The days (0-based) of the month's events: the night the upstream is down (a learned retry keeps failing:
    the bound), and the first day of each novel failure. Novel failures appear mid-month (days 9 to 14, in weeks 2
    and 3), none first in week 4, and each then recurs: the certificate every night, out of memory and the write
    denied every other night, the image tag every Monday and Friday deploy (:func:`recurs`)."""

    outage: int = 12
    certificate: int = 8  # a Tuesday
    image_tag: int = 9  # a Wednesday: the deploy reaches the web item (a Tuesday's migration aborts it first)
    oom: int = 10
    write_denied: int = 13  # a Sunday (not the outage night: the backup item fails one way a night)

    @classmethod
    def of(cls, days: int) -> Calendar:
        """The month's calendar; a week's for a run of fewer than 30 days (the reduced bench of the tests)."""
        return cls() if days >= 30 else cls(outage=4, certificate=2, oom=3, image_tag=4, write_denied=6)

    def recurs(self, name: str, day: int) -> bool:
        """Whether novel failure ``name`` happens on ``day``: from its first day on, as often as its kind recurs."""
        first = self.novel_day(name)
        if first is None or day < first:
            return False
        if name == "certificate":
            return True
        if name == "image-tag":
            return day == first or day % 7 in (0, 4)
        return (day - first) % 2 == 0

    def novel_day(self, name: str) -> int | None:
        days = {"certificate": self.certificate, "oom": self.oom, "image-tag": self.image_tag}
        return days.get(name, self.write_denied if name == "write-denied" else None)


NIGHTLY_ITEMS = ["backup", "assets", "mirror", "lint", "report", "docs", "index", "search"]
DEPLOY_ITEMS = ["api", "web"]

# ---------------------------------------------------------------- the world: what fails, and the right answer


@dataclass(frozen=True)
class Failure:
    """A kind of failure: how the agent states it, and what the person answers (``None``: it depends)."""

    name: str
    marker: str  # a phrase of its error, how the oracle recognises it
    answer: str | None
    novel: bool = False  # appears mid-month (Calendar), never seen before


FAILURES = [
    Failure("timeout", "timed out after", "retry"),
    Failure("upstream-503", "HTTP 503", "retry"),
    Failure("flaky-test", "known flaky", "skip"),
    Failure("snapshot", "snapshot drift", "skip"),
    Failure("disk", "disk usage at", None),  # retry or skip: the person looks at the disk, the agent did not say
    Failure("migration", "conflicts with a pending schema change", "abort"),
    Failure("healthcheck", "health check of", "retry"),
    Failure("certificate", "certificate for", "skip", novel=True),
    Failure("oom", "out of memory", "retry", novel=True),
    Failure("image-tag", "not found in the registry", "abort", novel=True),
    Failure("write-denied", "permission denied writing", "skip", novel=True),
]


def error_text(name: str, day: int, item: str) -> str:
    """The words an agent states for failure ``name`` on ``day``: numbers, addresses and ids change every day,
    the situation stays the same."""
    n = 17 + day * 7 % 61
    return {
        "timeout": f"connection to 10.0.{day % 250}.{day % 7 + 1} timed out after {30 + day}s",
        "upstream-503": f"upstream mirror answered HTTP 503 (request id {day * 7919:08x})",
        "flaky-test": f"test_upload_large failed after {n}s (known flaky)",
        "snapshot": f"snapshot drift in the report header ({n} lines)",
        "disk": f"disk usage at {80 + day % 15}% on /var/backups",
        "migration": f"migration {40 + day:04d} conflicts with a pending schema change",
        "healthcheck": f"health check of {item} returned 502 after {n}s",
        "certificate": f"certificate for {item}.example.org expires in {40 - day} days",
        "oom": f"out of memory while building the search index ({1024 + n} MB)",
        "image-tag": f"image tag {item}-{day}.{n} not found in the registry",
        "write-denied": f"permission denied writing /srv/backups/{day}.tar",
    }[name]


def nightly_plan(day: int, cal: Calendar) -> dict[str, list[str]]:
    """The nightly run of ``day``: each failing item's failure, one per attempt (a retry runs the next attempt;
    past the list the item succeeds)."""
    wd = day % 7
    plan: dict[str, list[str]] = {}
    plan["backup"] = ["timeout"] * (6 if day == cal.outage else 1)
    if cal.recurs("write-denied", day):
        plan["backup"] = ["write-denied"]
    if wd in (0, 2, 4, 5):
        plan["assets"] = ["timeout"]
    plan["mirror"] = ["upstream-503"]
    if wd != 6:
        plan["lint"] = ["flaky-test"]
    if day % 2 == 0:
        plan["report"] = ["snapshot"]
    if day % 3 == 1:
        plan["docs"] = ["disk"]
    if cal.recurs("oom", day):
        plan["index"] = ["oom"]
    if cal.recurs("certificate", day):
        plan["search"] = ["certificate"]
    return plan


def deploy_plan(day: int, cal: Calendar) -> dict[str, list[str]]:
    """The weekday deploy of ``day``: a migration conflict some days (abort), a flaky health check others."""
    wd = day % 7
    plan: dict[str, list[str]] = {}
    if wd in (1, 3):
        plan["api"] = ["migration"]
    if wd in (0, 2, 4):
        plan["web"] = ["healthcheck"]
    if wd in (0, 2, 4) and cal.recurs("image-tag", day):
        plan["web"] = ["image-tag"]
    return plan


def schedule(day: int, cal: Calendar, *, claude: bool = False) -> list[tuple[int, str, dict[str, list[str]]]]:
    """(hour, workflow, plan) of each run of ``day``: nightly every day, deploy and release on weekdays (and the
    Claude agent's CI triage, with ``claude``)."""
    runs: list[tuple[int, str, dict[str, list[str]]]] = [(2, "nightly", nightly_plan(day, cal))]
    if day % 7 < 5:
        runs += [(9, "deploy", deploy_plan(day, cal)), (11, "release", {})]
        if claude:
            runs.append((14, "triage", {}))
    return runs


def triage_commands(day: int) -> list[str]:
    """The Bash calls of the Claude agent's triage on ``day``: one the same every day, one whose arguments change
    (the failing test of the day): each asks permission (outside the agent's allowlist)."""
    return ["echo lint >> work/triage/lint.log", f"echo case_{day % 11}_{day} >> work/triage/tests.log"]


def failure_of(detail: str) -> Failure | None:
    """The failure an escalation's words state, as the oracle recognises it; ``detail`` may be a rule's normalised
    situation (``HTTP <n>``), as ``ambient rules`` shows it."""
    for f in FAILURES:
        if f.marker in detail or re.sub(r"\d+", "<n>", f.marker) in detail:
            return f
    return None


def review(rule: Mapping[str, Any]) -> str | None:
    """The person's review of a rule ``ambient rules`` proposes (its situation and option): None to accept it, else
    why they decline it. They accept only a rule whose option is the answer they give every time that situation
    happens; a situation they answer by judgement (retry or skip after looking at something the agent did not say)
    stays theirs, however consistent its first answers looked."""
    situation, option = rule.get("situation") or {}, rule.get("option")
    signal = str(situation.get("signal") or "")
    if signal == "GATE":
        right: str | None = "approve"
    elif signal == "PERMISSION":
        right = "allow"
    else:
        failure = failure_of(str(situation.get("signature") or ""))
        if failure is None:
            return f"a situation the person does not recognise: {situation.get('signature')!r}"
        if failure.answer is None:
            return f"{failure.name}: answered by judgement, never the same way every time"
        right = failure.answer
    return None if option == right else f"it would choose {option!r}, the person's answer is {right!r}"


def oracle(esc: Mapping[str, Any], day: int, before: int, seed: int, cal: Calendar) -> str:
    """The right answer to an escalation (its stored fields) asked on ``day``, ``before`` questions of the same
    item in the same run before it: the person's, whoever answered."""
    if esc.get("kind") == "gate":
        return "approve"
    if esc.get("kind") == "permission":
        return "allow"  # once: the person reads the command each time
    failure = failure_of(str(esc.get("detail") or esc.get("question") or ""))
    if failure is None:
        raise RuntimeError(f"the bench's oracle does not know this question: {esc.get('question')!r}")
    if failure.name == "timeout" and day == cal.outage and esc.get("item") == "backup":
        return "retry" if before < AUTO_REPEATS else "skip"  # three tries are fine; then the person gives up
    if failure.answer is None:
        return random.Random(f"{seed}/{day}/{esc.get('item')}").choice(["retry", "skip"])
    return failure.answer


# ---------------------------------------------------------------- the brain

JOB_AGENT = """\
import json, os, pathlib, sys

json.load(sys.stdin)
plan = json.loads((pathlib.Path(os.environ["AMBIENT_BRAIN"]) / "workspace" / "plan.json").read_text())
errors = plan.get(os.environ["AMBIENT_ITEM"], [])
attempt = int(os.environ["AMBIENT_ATTEMPT"])
if attempt <= len(errors):
    print(json.dumps({"status": "failed", "error": errors[attempt - 1]}))
    sys.exit(1)
print(json.dumps({"status": "ok"}))
"""

BUILD_AGENT = """\
import json, sys

json.load(sys.stdin)
print(json.dumps({"status": "ok"}))
"""


def agent_file(name: str, script: str) -> str:
    return (
        "---\n"
        f"name: {name}\n"
        "type: agent\nstatus: active\n"
        f'description: "{name}, an agent of the autonomy bench"\n'
        "brain:\n  version: 1\n  type: metier\n  scope: project\n  ipc:\n"
        "    receives_from: [ambient, orchestrator, human]\n"
        "    sends_to: [ambient, orchestrator, human]\n"
        "    zone_access: [project]\n"
        "    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]\n"
        "ambient:\n  runner:\n    kind: command\n"
        f'    argv: ["{{{{python}}}}", "bin/{script}"]\n'
        "    timeout_s: 60\n"
        "---\n"
        f"# {name}\n"
    )


def foreach(name: str, items: list[str], agent: str, concurrency: int) -> str:
    return (
        f"workflow: {name}\nstatus: draft\n"
        "for_each:\n"
        f"  items: {json.dumps(items)}\n"
        f"  spawn: {agent}\n"
        f"  concurrency: {concurrency}\n"
        f'  scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}\n'
    )


RELEASE = """\
workflow: release
status: draft
chain:
  - {step: 1, type: deploy, scope: workspace/release/, agents: [builder]}
  - {step: 2, type: deploy, scope: workspace/release/, agents: [builder], gate: human}
"""


TRIAGE = """\
workflow: triage
status: draft
for_each:
  items: [ci]
  spawn: triager
  concurrency: 1
  scope: {zone: project, files: ["work/triage"]}
"""


def triager_file(day: int) -> str:
    """The Claude agent of the CI triage, its playbook for the fake model (ambient.testing.fakeapi) that of ``day``."""
    steps: list[dict[str, Any]] = [{"tool": "Bash", "input": {"command": c}} for c in triage_commands(day)]
    steps.append({"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}})
    steps.append({"on_deny": {"signal": "RETURN", "result": {"status": "partial", "note": "not allowed"}}})
    return (
        "---\nname: triager\ntype: agent\nbrain:\n  version: 1\n  ipc:\n"
        "    receives_from: [ambient, orchestrator, human]\n"
        "    sends_to: [ambient, orchestrator, human]\n"
        "    zone_access: [project]\n"
        "    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]\n"
        "ambient:\n  runner:\n    kind: claude\n    timeout_s: 120\n---\n"
        "You triage the failing CI jobs of the night.\n\n"
        "```fake-model\n" + "\n".join(json.dumps(x) for x in steps) + "\n```\n"
    )


class Hook(ThreadingHTTPServer):
    """The person's phone: an apprise ``json://`` endpoint on 127.0.0.1 keeping every notification."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HookHandler)
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server_address[1]}/hook"

    def texts(self) -> list[str]:
        with self.lock:
            return [f"{p.get('title', '')}\n{p.get('message', '')}" for p in self.posts]


class _HookHandler(BaseHTTPRequestHandler):
    server: Hook

    def log_message(self, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.posts.append(json.loads(raw or b"{}"))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMBIENT_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    if os.geteuid() == 0:  # root runs agents as an unprivileged user it makes; as root without capabilities here
        env["AMBIENT_AGENT_USER"] = "root"
    return env


# ---------------------------------------------------------------- the month


@dataclass
class Week:
    """What one ISO week of the month asked of the person, and what rules decided alone."""

    label: str
    runs: int = 0
    asked: int = 0
    auto: int = 0
    wrong: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # failure name → questions that reached the person
    # Questions that must reach the person whatever the loop learned: a novel failure's first, one the person
    # answers both ways.
    must_ask: int = 0
    perm: int = 0  # tool permissions asked of the person (not in ``asked``)
    perm_new: int = 0  # of which for a call never asked before
    perm_auto: int = 0  # tool permissions a learned rule answered alone (not in ``auto``)

    @property
    def learnable(self) -> int:
        """The questions a learning loop could have spared the person."""
        return self.asked - self.must_ask


@dataclass
class Month:
    """The bench's result: weeks, the invariants' evidence, and what the rules file says at the end."""

    days: int
    weeks: list[Week]
    wrong: list[str]  # each wrong automatic decision, said
    novel_first: dict[str, str]  # novel failure → who answered its first question ("person" or the rule)
    max_auto_per_item: int
    rules: list[dict[str, Any]]
    inconsistent_auto: int  # automatic decisions on a situation the person answers inconsistently
    forgotten: list[str]  # rules the person stopped after reading a wrong automatic decision
    declined: list[str]  # proposed rules the person read and declined (``ambient rules forget``), said
    seconds: float
    calendar: Calendar
    cpu: float = 0.0
    stats_headline: str = ""

    def reduction(self) -> float | None:
        """Questions of week 4 over week 1 (the first four full weeks)."""
        if len(self.weeks) < 4 or not self.weeks[0].asked:
            return None
        return self.weeks[3].asked / self.weeks[0].asked

    def misses(self) -> list[str]:
        out = []
        if self.wrong:
            out.append(f"{len(self.wrong)} wrong automatic decision(s)")
        late = [n for n, who in self.novel_first.items() if who != "person"]
        if late:
            out.append(f"novel failure(s) decided alone the first time: {', '.join(late)}")
        if self.max_auto_per_item > AUTO_REPEATS:
            out.append(f"an item decided alone {self.max_auto_per_item} times (bound {AUTO_REPEATS})")
        red = self.reduction()
        if red is not None and red > 0.10:
            out.append(f"week 4 asks {red:.0%} of week 1 (target <= 10 %)")
        return out


class Bench:
    """One brain, its daemon on the simulated clock, and the scripted person."""

    def __init__(
        self, base: Path, seed: int, cal: Calendar, say: Callable[[str], None] = print, *, claude: bool = False
    ) -> None:
        self.base, self.seed, self.cal, self.say, self.claude = base, seed, cal, say, claude
        self.api: Any = None
        self.root = base / "brain"
        self.clock = base / "clock.json"
        self.env = _env()
        self.hook = Hook()
        self.proc: subprocess.Popen[bytes] | None = None
        self.answered: set[str] = set()  # escalations the person answered
        self.forgotten: list[str] = []  # rules the person stopped after a wrong automatic decision, said
        self.declined: list[str] = []  # proposed rules the person read and declined, said
        self.reviewed: set[str] = set()  # automatic decisions the person has read
        self._runs: list[dict[str, Any]] = []
        self._runs_size = -1
        self._escs: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}

    # -- commands, as the person types them (on the simulated clock)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(BENCH / "simclock.py"), str(self.clock), "--brain", str(self.root), *args]
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"ambient {' '.join(args)} exited {res.returncode}: {res.stderr[-800:]}")
        return res

    def setup(self) -> None:
        set_clock(self.clock, START)
        res = subprocess.run(
            [sys.executable, str(BENCH / "simclock.py"), str(self.clock), "init", str(self.root)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"ambient init failed: {res.stderr}")
        for wf in (self.root / "workflows").glob("*.yml"):
            wf.unlink()  # the example's hello workflow would start at once
        (self.root / "bin" / "job.py").write_text(JOB_AGENT)
        (self.root / "bin" / "build.py").write_text(BUILD_AGENT)
        (self.root / "agents" / "nightly-job.md").write_text(agent_file("nightly-job", "job.py"))
        (self.root / "agents" / "deployer.md").write_text(agent_file("deployer", "job.py"))
        (self.root / "agents" / "builder.md").write_text(agent_file("builder", "build.py"))
        (self.root / "workflows" / "nightly.yml").write_text(foreach("nightly", NIGHTLY_ITEMS, "nightly-job", 4))
        (self.root / "workflows" / "deploy.yml").write_text(foreach("deploy", DEPLOY_ITEMS, "deployer", 1))
        (self.root / "workflows" / "release.yml").write_text(RELEASE)
        if self.claude:
            from ambient.testing.fakeapi import FakeAnthropic

            self.api = FakeAnthropic().__enter__()
            self.env.update({"ANTHROPIC_BASE_URL": self.api.url, "ANTHROPIC_API_KEY": "sk-ant-bench-key-0123456789"})
            (self.root / "agents" / "triager.md").write_text(triager_file(0))
            (self.root / "workflows" / "triage.yml").write_text(TRIAGE)
            (self.root / "work" / "triage").mkdir(parents=True, exist_ok=True)
        (self.root / "workspace").mkdir(exist_ok=True)
        config = self.root / "profil" / "ambient.yml"
        config.write_text(
            config.read_text()
            + f'\nnotify:\n  urls: ["{self.hook.url}"]\n  results: none\n'
            + f"learning:\n  auto_repeats: {AUTO_REPEATS}\n  backoff_s: {BACKOFF_S}\n"
        )
        self.cli("validate")

    def start_daemon(self) -> None:
        argv = [sys.executable, str(BENCH / "simclock.py"), str(self.clock), "--brain", str(self.root), "run"]
        with (self.base / "daemon.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "--log-format", "json", "--log-level", "info"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait(lambda: b"daemon_ready" in (self.base / "daemon.log").read_bytes(), "the daemon to be ready")

    def stop_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.hook.shutdown()
        self.hook.server_close()
        if self.api is not None:
            self.api.__exit__(None, None, None)

    def _wait(self, cond: Callable[[], Any], what: str, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if self.proc is not None and self.proc.poll() is not None:
                tail = (self.base / "daemon.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the daemon exited while waiting for {what}:\n{tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.02)  # polling a condition, as tests/acceptance/harness.py's wait() does

    # -- what the person sees

    def records(self) -> list[dict[str, Any]]:
        """The run records of ``.ambient/runs.jsonl`` (read again only when it grew)."""
        path = self.root / ".ambient" / "runs.jsonl"
        size = path.stat().st_size if path.exists() else 0
        if size != self._runs_size:
            self._runs_size = size
            self._runs = []
            for line in path.read_text().splitlines() if size else []:
                try:
                    self._runs.append(json.loads(line))
                except ValueError:
                    continue
        return self._runs

    def escalation(self, path: Path) -> dict[str, Any] | None:
        """One escalation's file (parsed again only when it changed)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        sig = (st.st_mtime_ns, st.st_size)
        hit = self._escs.get(path)
        if hit is None or hit[0] != sig:
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                return None
            if not isinstance(data, dict):
                return None
            hit = self._escs[path] = (sig, data)
        return hit[1]

    def escalations(self) -> list[dict[str, Any]]:
        folder = self.root / ".ambient" / "escalations"
        return [e for p in folder.glob("esc-*.yml") if (e := self.escalation(p)) is not None]

    def notified(self) -> set[str]:
        """Escalation ids whose question reached the person (not a reminder, not information)."""
        ids = set()
        for text in self.hook.texts():
            ids.update(re.findall(r"ambient decide (esc-[a-z0-9]+)", text))
        return ids

    # -- one run, one day, the month

    def one_run(self, day: int, workflow: str, plan: dict[str, list[str]]) -> str:
        """Start ``workflow`` now (simulated), answer what reaches the person, until its run is recorded."""
        plan_text = {item: [error_text(n, day, item) for n in names] for item, names in plan.items()}
        (self.root / "workspace" / "plan.json").write_text(json.dumps(plan_text))
        before = len(self.records())
        self.cli("start", workflow)
        folder = self.root / ".ambient" / "escalations"
        while True:
            recs = self.records()
            new = [r for r in recs[before:] if r.get("workflow") == workflow]
            if new:
                run_id = str(new[-1]["run_id"])
                self.read_notices()
                return run_id
            asked = []
            for esc_id in self.notified() - self.answered:
                esc = self.escalation(folder / f"{esc_id}.yml")
                if esc is not None and esc.get("status") == "pending":
                    asked.append(esc)
            for esc in sorted(asked, key=lambda e: str(e.get("created_at"))):
                answer = oracle(esc, day, self._before(esc, self.escalations()), self.seed, self.cal)
                res = self.cli("decide", esc["id"], answer, check=False)
                if res.returncode not in (0, 1):  # 1: settled meanwhile (its run aborted, say)
                    raise RuntimeError(f"ambient decide {esc['id']} {answer}: {res.returncode} {res.stderr[-500:]}")
                self.answered.add(esc["id"])
            if not asked:
                time.sleep(0.02)  # polling the brain's files, as a wait on a condition

    def read_notices(self) -> None:
        """The person reads what rules decided alone (each automatic decision is a notice naming the rule) and,
        where one chose otherwise than they would have, stops it: ``ambient rules forget ID``."""
        escs = self.escalations()
        texts = "\n".join(self.hook.texts())
        days = self.run_days()
        for esc in escs:
            by = str(esc.get("by") or "")
            if esc["id"] in self.reviewed or not by.startswith("rule:") or esc.get("run_id") not in days:
                continue
            rule_id = by.removeprefix("rule:")
            if f"in run {esc['run_id']} by learned rule {rule_id}" not in texts:
                continue  # not told yet: read at the next look
            self.reviewed.add(esc["id"])
            day = days[esc["run_id"]]
            right = oracle(esc, day, self._before(esc, escs), self.seed, self.cal)
            if esc.get("decision") != right and self.cli("rules", "forget", rule_id, check=False).returncode == 0:
                self.forgotten.append(f"day {day + 1}: {rule_id} chose {esc.get('decision')!r}, not {right!r}")

    def run_days(self) -> dict[str, int]:
        """Each recorded run's simulated day, from its ``started_at`` (ambient's clock)."""
        return {
            r["run_id"]: (datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")) - START).days
            for r in self.records()
        }

    @staticmethod
    def _before(esc: Mapping[str, Any], escs: list[dict[str, Any]]) -> int:
        """Questions (in ``escs``) on the same item of the same run asked before this one."""
        return sum(
            1
            for e in escs
            if e.get("run_id") == esc.get("run_id")
            and (e.get("item") or e.get("step")) == (esc.get("item") or esc.get("step"))
            and str(e.get("created_at")) < str(esc.get("created_at"))
        )

    def review_proposed(self, day: int) -> list[str]:
        """Read each rule ``ambient rules`` proposes (active, not deciding alone yet): accept it
        (``ambient rules accept ID``) when its option is the person's answer to every occurrence of its situation,
        else decline it (``ambient rules forget ID``: it no longer predicts nor decides). Returns those accepted."""
        book = json.loads(self.cli("rules", "--json").stdout)
        accepted = []
        for rule in book["rules"]:
            if rule["state"] == "active" and not rule["decides_alone"] and not rule.get("lost_standing"):
                why = review(rule)
                if why is None:
                    if self.cli("rules", "accept", rule["id"], check=False).returncode == 0:
                        accepted.append(rule["id"])
                elif self.cli("rules", "forget", rule["id"], check=False).returncode == 0:
                    self.declined.append(f"day {day + 1}: {rule['id']} ({why})")
                    self.say(f"  day {day + 1:2d}: the person declines {rule['id']}: {why}")
        return accepted

    def month(self, days: int) -> Month:
        t0 = time.monotonic()
        self.setup()
        self.start_daemon()
        try:
            for day in range(days):
                if self.claude:  # the day's playbook, written hours (simulated) before the agent runs
                    (self.root / "agents" / "triager.md").write_text(triager_file(day))
                for hour, workflow, plan in schedule(day, self.cal, claude=self.claude):
                    set_clock(self.clock, START + timedelta(days=day, hours=hour))
                    self.one_run(day, workflow, plan)
                set_clock(self.clock, START + timedelta(days=day, hours=18))
                accepted = self.review_proposed(day)
                if accepted:
                    self.say(f"  day {day + 1:2d}: the person accepts {', '.join(accepted)}")
            stats = self.cli("stats", "--weeks", "6", check=False).stdout
        finally:
            self.stop_daemon()
        month = self.tally(days, time.monotonic() - t0)
        month.stats_headline = stats
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        month.cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        return month

    def tally(self, days: int, seconds: float) -> Month:
        """The month as the brain recorded it: each run's simulated day from its ``started_at`` (ambient's clock),
        each question from its escalation file (who answered it: the person, or ``rule:ID``)."""
        run_day = self.run_days()
        weeks = [Week(iso_week(START + timedelta(days=7 * w))) for w in range((days + 6) // 7)]
        for rec in self.records():
            if rec["run_id"] in run_day:
                weeks[run_day[rec["run_id"]] // 7].runs += 1
        escs = sorted(self.escalations(), key=lambda e: str(e.get("created_at")))
        wrong: list[str] = []
        novel_first: dict[str, str] = {}
        per_item: dict[tuple[str, str, str], int] = {}
        inconsistent_auto = 0
        calls: set[str] = set()  # permission calls asked so far
        for esc in escs:
            if esc.get("run_id") not in run_day or esc.get("status") != "answered":
                continue
            day = run_day[esc["run_id"]]
            week = weeks[day // 7]
            by = str(esc.get("by") or "")
            failure = failure_of(str(esc.get("detail") or esc.get("question") or ""))
            kind = (
                str(esc.get("kind"))
                if esc.get("kind") in ("gate", "permission")
                else (failure.name if failure else "?")
            )
            first_of_novel = failure is not None and failure.novel and failure.name not in novel_first
            if failure is not None and first_of_novel:
                novel_first[failure.name] = "person" if not by.startswith("rule:") else by
            if kind == "permission":  # counted apart: tool permissions are matched on the exact call
                new_call = esc.get("detail") not in calls
                calls.add(str(esc.get("detail")))
                if by.startswith("rule:"):
                    week.perm_auto += 1
                else:
                    week.perm += 1
                    week.perm_new += new_call
            if by.startswith("rule:"):
                week.auto += kind != "permission"
                key = (esc["run_id"], str(esc.get("item") or esc.get("step")), by)
                per_item[key] = per_item.get(key, 0) + 1
                right = oracle(esc, day, self._before(esc, escs), self.seed, self.cal)
                if failure is not None and failure.answer is None:
                    inconsistent_auto += 1
                if esc.get("decision") != right:
                    week.wrong += 1
                    wrong.append(
                        f"day {day + 1} {esc['workflow']}/{esc.get('item') or esc.get('step')}: {by} chose "
                        f"{esc.get('decision')!r}, the person's answer is {right!r} ({kind})"
                    )
            elif kind != "permission":
                week.asked += 1
                week.by_kind[kind] = week.by_kind.get(kind, 0) + 1
                if first_of_novel or (failure is not None and failure.answer is None):
                    week.must_ask += 1
        for f in FAILURES:
            first = self.cal.novel_day(f.name)
            if first is not None and first < days and f.name not in novel_first:
                novel_first[f.name] = "never asked"
        rules = json.loads(self.cli("rules", "--json").stdout)["rules"]
        return Month(
            days=days,
            weeks=weeks,
            wrong=wrong,
            novel_first=novel_first,
            max_auto_per_item=max(per_item.values(), default=0),
            rules=rules,
            inconsistent_auto=inconsistent_auto,
            forgotten=self.forgotten,
            declined=self.declined,
            seconds=seconds,
            calendar=self.cal,
        )


def iso_week(when: datetime) -> str:
    """``2026-W02``, as ``ambient stats`` labels its weeks."""
    year, week, _ = when.isocalendar()
    return f"{year}-W{week:02d}"


def run_month(base: Path, days: int, seed: int, say: Callable[[str], None] = print, *, claude: bool = False) -> Month:
    """The bench's core: ``days`` simulated days on a fresh brain under ``base``; the tally. ``claude``: a Claude
    agent (the real Claude Code CLI against the fake model API) triages CI on weekdays, asking permissions."""
    return Bench(base, seed, Calendar.of(days), say, claude=claude).month(days)


def report(m: Month) -> list[str]:
    lines = [
        f"{'WEEK':9} {'DAYS':>4} {'RUNS':>4} {'ASKED':>5} {'AUTO':>4} {'WRONG':>5} {'PERM':>4} {'(NEW)':>5} "
        f"{'PERM-AUTO':>9}  ASKED BY KIND"
    ]
    for i, w in enumerate(m.weeks):
        ndays = min(7, m.days - 7 * i)
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(w.by_kind.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"{w.label:9} {ndays:>4} {w.runs:>4} {w.asked:>5} {w.auto:>4} {w.wrong:>5} {w.perm:>4} {w.perm_new:>5} "
            f"{w.perm_auto:>9}  {kinds}"
        )
    red = m.reduction()
    if red is not None:
        w1, w4 = m.weeks[0], m.weeks[3]
        lines.append(
            f"questions a loop could spare (not a novel failure's first, not answered both ways): "
            f"week 1 {w1.learnable}, week 4 {w4.learnable} ({w4.learnable / max(1, w1.learnable):.0%}); "
            f"must reach the person: week 1 {w1.must_ask}, week 4 {w4.must_ask}"
        )
        lines.append(
            f"week 4 asks {m.weeks[3].asked} questions, week 1 {m.weeks[0].asked}: {red:.0%} "
            f"(target <= 10 %: {'met' if red <= 0.10 else 'MISSED'})"
        )
    lines.append(f"wrong automatic decisions: {len(m.wrong)} (target 0)")
    lines.extend(f"  {w}" for w in m.wrong)
    lines.append(
        "novel failures, who answered the first one: "
        + ", ".join(f"{n} (day {(m.calendar.novel_day(n) or 0) + 1}): {who}" for n, who in m.novel_first.items())
    )
    lines.append(
        f"most automatic decisions on one item of one run: {m.max_auto_per_item} (bound {AUTO_REPEATS}); "
        f"automatic decisions on the inconsistently answered situation: {m.inconsistent_auto}"
    )
    lines.append(f"proposed rules the person read and declined: {len(m.declined)}")
    lines.extend(f"  {d}" for d in m.declined)
    lines.extend(f"the person read a wrong automatic decision and forgot its rule: {f}" for f in m.forgotten)
    deciding = [r for r in m.rules if r.get("decides_alone")]
    lines.append(
        f"rules at the end: {len(m.rules)}, deciding alone {len(deciding)}; {m.seconds:.0f} s wall time, "
        f"{m.cpu:.0f} s of CPU (the bench, the daemon, the agents and every command)"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7, help="seed of the person's inconsistent answers")
    ap.add_argument("--dir", default=None, help="where to make the brain (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the brain for inspection")
    ap.add_argument("--stats", action="store_true", help="also print `ambient stats --weeks 6` at the end")
    ap.add_argument("--json", default=None)
    ap.add_argument("--claude", action="store_true", help="add the Claude agent's CI triage (permission prompts)")
    ap.add_argument("--tally", metavar="DIR", default=None, help="only count again what a kept run left in DIR")
    args = ap.parse_args()
    if args.tally:
        m = Bench(Path(args.tally), args.seed, Calendar.of(args.days)).tally(args.days, 0.0)
    else:
        with TempDir(args.dir, args.keep) as base:
            print(f"a simulated month of {args.days} days from {START.date()} in {base}")
            m = run_month(base, args.days, args.seed, claude=args.claude)
    for line in report(m):
        print(line)
    if args.stats:
        print(m.stats_headline)
    if args.json:
        data = {"weeks": [w.__dict__ for w in m.weeks], "wrong": m.wrong, "declined": m.declined}
        Path(args.json).write_text(json.dumps(data, indent=1))
    misses = m.misses()
    print("targets: " + ("all met" if not misses else "MISSED: " + "; ".join(misses)))
    return 0 if not misses else 1


if __name__ == "__main__":
    raise SystemExit(main())
