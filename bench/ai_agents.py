"""Claude agents through ambient against the same prompts through the Claude Agent SDK alone, in one run.

Both sides drive the real Claude Code CLI (the SDK's bundled binary) against ``FakeAnthropic``
(``ambient.testing.fakeapi``), a fake Messages API on 127.0.0.1 served by a thread of this process, which answers
every request after ``--delay-s`` (default 0.05 s, a small stand-in for a model's time to answer) with the default
playbook: a RETURN, no tool call (``--tool-step`` adds one ``Read`` before it: the permission path of every tool call).

- **ambient**: a fresh brain with one ``kind: claude`` agent, ``concurrency: 4`` in ``profil/ambient.yml`` and in
  the workflow, served by one real daemon (``python -m ambient run``, ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``
  in its environment); for_each workflows are dropped into it one after another, each timed from its journal
  (``started`` → ``finished_run``), as ``bench/fanout.py`` does: the daemon's own start-up is not in these figures
  (``--until-idle`` below measures it);
- **bare**: ``claude_agent_sdk.query`` in a separate Python process (as the daemon is one), the same system prompt
  appended to Claude Code's preset (the agent's body and ambient's answer contract), the same brief as user prompt,
  ``setting_sources=[]``, a ``can_use_tool`` that allows, ``CLAUDE_CONFIG_DIR``/``HOME``/``TMPDIR`` in a temp dir,
  the brain's root as working folder (ambient's default ``workdir``), 4 sessions at a time under an asyncio
  semaphore; timed from the first ``query()`` to the last result.

Both processes get bytecode caches (``PYTHONPYCACHEPREFIX`` in the temp dir, ``PYTHONDONTWRITEBYTECODE`` dropped, as
``bench/cli.py`` does): with that variable set, as in some sandboxes, each agent's launcher would compile the ambient
modules it imports.

Measured, each side's first run apart (cold), then runs interleaved ambient, bare, ambient, bare...:

1. throughput: ``--n`` items at concurrency 4, agents/s (median of ``--repeats``), the ratio ambient/bare per pair
   (target: ≥ 0.9), and the CPU each side spent per agent (its process, and its children: Claude Code);
2. SPAWN → first API request, per item: from the item's ``accepted`` record in the run journal (written when ambient
   admits the item's SPAWN, just before the fsync that precedes its agent) to the fake receiving the first request
   whose first user message says ``Item: <name>``; bare: from the ``query()`` call to the same. Median and p90 of
   every item of the warm runs, and of ``--singles`` one-item runs (one agent at a time, interleaved too);
3. the prompt-cache prefix: the ``system`` field of each item's main request (the one carrying ambient's contract,
   not Claude Code's side requests) compared across the items of each run, as JSON (the fake keeps parsed bodies):
   byte-identical or not, and the number of distinct ones (also ``tools`` + ``system``, the whole cached prefix);
4. ``ambient run --until-idle`` on a fresh brain, whole wall time, with ``--n`` items and with one (its fixed
   start-up), once each;
5. the launcher's own start-up: ambient starts each CLI through ``.ambient/claude/launch`` (a Python script that
   cleans the environment and execs the CLI); timed here exec'ing ``/bin/true`` instead;
6. the model gateway's cost per model call (``--gateway-only`` measures it alone, in seconds): the same request to
   the fake API (no delay) straight and through a ``ModelGateway`` recording each call with an fsync, in
   interleaved pairs, a JSON answer and a streamed one; median and p90 of the difference per pair.

Usage: ``python bench/ai_agents.py [--n 20] [--repeats 5] [--singles 5] [--delay-s 0.05] [--tool-step]
[--skip until-idle,launcher,gateway] [--gateway-only] [--unconfined] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    PY,
    ServingDaemon,
    Steal,
    TempDir,
    agent_md,
    daemon_argv,
    daemon_env,
    epoch,
    median,
    new_brain,
    run_span,
)

AGENT = "writer"
BODY = "You write release notes for the item you are given, one paragraph, plain words."
KEY = "sk-ant-bench-0123456789"
CONCURRENCY = 4
#: The file the ``--tool-step`` playbook reads, in the brain's root (both sides' working folder).
NOTES = "notes.md"
#: Whether ambient's agent runs confined (the default); ``--unconfined`` measures the jail's cost.
CONFINED = [True]
_ITEM = re.compile(r"^Item:[ \t]*(.+?)[ \t]*$", re.MULTILINE)


def agent_text(read: Path | None) -> str:
    """The agent file: a ``kind: claude`` runner, a one-line prompt (and, with ``read``, a playbook whose first step
    reads that file)."""
    body = BODY
    if read is not None:
        steps = [
            {"tool": "Read", "input": {"file_path": str(read)}},
            {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}},
        ]
        body += "\n\n```fake-model\n" + "\n".join(json.dumps(s) for s in steps) + "\n```"
    runner: dict[str, Any] = {"kind": "claude", "timeout_s": 300, **({} if CONFINED[0] else {"confine": False})}
    return agent_md(AGENT, runner) + "\n" + body + "\n"


def workflow_yaml(name: str, items: Sequence[str], concurrency: int) -> str:
    return (
        f"workflow: {name}\n"
        "for_each:\n"
        f"  items: {json.dumps(list(items))}\n"
        f"  spawn: {AGENT}\n"
        f"  concurrency: {concurrency}\n"
        "  scope:\n    zone: project\n"
        f'    files: ["projects/{name}/{{{{item}}}}.md"]\n'
    )


# ----------------------------------------------------------------------------------------------- the fake API


def timed_fake(delay_s: float) -> Any:
    """A ``FakeAnthropic`` that also notes when each request arrived (``arrivals[i]`` ↔ ``requests[i]``)."""
    from ambient.testing.fakeapi import FakeAnthropic, Recorded

    class TimedFake(FakeAnthropic):
        def __init__(self) -> None:
            super().__init__(delay_s=delay_s)
            self.arrivals: list[float] = []

        def _record(self, rec: Recorded) -> None:
            with self._cond:  # an RLock: the base class takes it again
                self.arrivals.append(time.time())
                super()._record(rec)

        def since(self, start: int) -> list[tuple[float, Recorded]]:
            with self._cond:
                return list(zip(self.arrivals[start:], self._requests[start:], strict=True))

    return TimedFake()


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return []


def item_of(body: dict[str, Any] | None) -> str | None:
    """The ``Item: <name>`` line of a request's first user message."""
    for message in (body or {}).get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            for text in _texts(message.get("content")):
                match = _ITEM.search(text)
                if match:
                    return match.group(1)
            return None
    return None


def is_main(body: dict[str, Any] | None) -> bool:
    """An agent's own request (its system prompt carries ambient's contract), not one of Claude Code's side requests."""
    from ambient.testing.fakeapi import CONTRACT_MARKER

    system = (body or {}).get("system")
    blocks = system if isinstance(system, list) else [system]
    return any(CONTRACT_MARKER in t for b in blocks for t in _texts([b] if isinstance(b, dict) else b))


def first_requests(window: list[tuple[float, Any]]) -> dict[str, float]:
    """Item → arrival time of the first request about it."""
    out: dict[str, float] = {}
    for at, rec in window:
        item = item_of(rec.body)
        if item is not None and item not in out:
            out[item] = at
    return out


def prefixes(window: list[tuple[float, Any]]) -> dict[str, Any]:
    """The cacheable prefix of each item's first main request: distinct ``system`` fields and ``tools``+``system``."""
    seen: dict[str, Any] = {}
    for _at, rec in window:
        item = item_of(rec.body)
        if item is not None and item not in seen and is_main(rec.body):
            seen[item] = rec.body
    systems = {json.dumps(b.get("system"), ensure_ascii=False) for b in seen.values()}
    whole = {json.dumps([b.get("tools"), b.get("system")], ensure_ascii=False) for b in seen.values()}
    return {"requests": len(seen), "distinct_system": len(systems), "distinct_tools_system": len(whole)}


def tool_results(window: list[tuple[float, Any]]) -> dict[str, int]:
    """The tool calls the agents' requests report done, by outcome (each ``tool_use_id`` once)."""
    seen: dict[str, bool] = {}
    for _at, rec in window:
        for message in (rec.body or {}).get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    seen[str(block.get("tool_use_id"))] = bool(block.get("is_error"))
    return {"ok": sum(1 for e in seen.values() if not e), "error": sum(1 for e in seen.values() if e)}


def pct(values: Sequence[float], q: float) -> float:
    vals = sorted(values)
    return vals[round(q * (len(vals) - 1))] if vals else float("nan")


# --------------------------------------------------------------------------------------------------- the bare side


async def _bare_run(spec: dict[str, Any]) -> dict[str, Any]:
    from claude_agent_sdk import ClaudeAgentOptions, PermissionResultAllow, ResultMessage, query

    async def allow(_name: str, _input: dict[str, Any], _ctx: Any) -> Any:
        return PermissionResultAllow()

    sem = asyncio.Semaphore(spec["concurrency"])
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    failures: list[str] = []

    async def one(item: str, text: str) -> None:
        async def prompt() -> Any:
            yield {"type": "user", "message": {"role": "user", "content": text}, "parent_tool_use_id": None}

        options = ClaudeAgentOptions(
            system_prompt={"type": "preset", "preset": "claude_code", "append": spec["append"]},
            setting_sources=[],
            can_use_tool=allow,
            cwd=spec["cwd"],
            env=spec["env"],
            stderr=lambda _line: None,
        )
        async with sem:
            result: Any = None
            started[item] = time.time()
            async for message in query(prompt=prompt(), options=options):
                if isinstance(message, ResultMessage):
                    result = message
            ended[item] = time.time()
        if result is None or result.is_error or f'"item": "{item}"' not in str(result.result):
            failures.append(f"{item}: {getattr(result, 'result', None)!r}"[:300])

    ru0, rc0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    await asyncio.gather(*(one(item, text) for item, text in spec["prompts"]))
    t1 = time.time()
    ru1, rc1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "t0": t0,
        "t1": t1,
        "started": started,
        "ended": ended,
        "failures": failures,
        "cpu_self_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
        "cpu_children_s": rc1.ru_utime + rc1.ru_stime - rc0.ru_utime - rc0.ru_stime,
    }


def bare_worker() -> int:
    """``--bare-worker``: one JSON spec a line on stdin, one JSON result a line on stdout (a warm process, as the
    daemon is one)."""
    import claude_agent_sdk  # noqa: F401 - imported before any timing

    for line in sys.stdin:
        if not line.strip():
            continue
        out = asyncio.run(_bare_run(json.loads(line)))
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


class BareWorker:
    def __init__(self, log: Path, env: dict[str, str]) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [PY, __file__, "--bare-worker"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bare worker died: {self._log.name}")
        data: dict[str, Any] = json.loads(line)
        return data

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self._log.close()


# --------------------------------------------------------------------------------------------------------- a run


def _cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _brief(root: Path, workflow: str, item: str) -> str:
    """The user prompt ambient renders for ``item`` (the bare side sends the same)."""
    from ambient.runners.base import RunRequest
    from ambient.runners.prompt import render_brief

    packet = {
        "scope": {"zone": "project", "files": [f"projects/{workflow}/{item}.md"]},
        "payload": {"context": {"item": item}},
    }
    req = RunRequest(
        packet=packet,
        agent=AGENT,
        run_id="bench",
        item=item,
        attempt=1,
        key=f"bench/{item}/1",
        channel_token="",
        brain=root,
        vars={"workflow": workflow},
    )
    return render_brief(req)


class Bench:
    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        from ambient.runners.prompt import read_agent_prompt, system_prompt

        self.base, self.args = base, args
        self.api = timed_fake(args.delay_s)
        self.api.start()
        root = base / "brain"
        read = root / NOTES if args.tool_step else None
        self.root = new_brain(base, "brain", {AGENT: agent_text(read)}, concurrency=CONCURRENCY)
        (self.root / NOTES).write_text("# Notes\n\nRelease 1.2: faster start-up.\n")
        self.append = system_prompt(read_agent_prompt(self.root / "agents" / f"{AGENT}.md"))
        # Bytecode caches as a user has them (bench/cli.py): PYTHONDONTWRITEBYTECODE, set in some sandboxes, would
        # make each agent's launcher compile the ambient modules it imports; the caches go to a temp prefix.
        env = {k: v for k, v in daemon_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        self.env = env | {"ANTHROPIC_BASE_URL": self.api.url, "ANTHROPIC_API_KEY": KEY}
        bare = base / "bare"
        for d in ("config", "home", "tmp"):
            (bare / d).mkdir(parents=True)
        self.bare_env = {
            "CLAUDE_CONFIG_DIR": str(bare / "config"),
            "HOME": str(bare / "home"),
            "TMPDIR": str(bare / "tmp"),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "ANTHROPIC_BASE_URL": self.api.url,
            "ANTHROPIC_API_KEY": KEY,
        }
        self.bare_cwd = str(self.root)  # ambient's default workdir: the same folder (Claude Code's state is apart)
        self.runs = 0

    def close(self) -> None:
        self.api.stop()

    def _label(self, side: str) -> str:
        self.runs += 1
        return f"{side}{self.runs:02d}"

    def ambient(self, daemon: ServingDaemon, n: int, concurrency: int) -> dict[str, Any]:
        label = self._label("amb")
        items = [f"{label}-i{j:02d}" for j in range(n)]
        assert daemon.proc is not None
        start = len(self.api.requests)
        cpu0 = _cpu(daemon.proc.pid)
        t0 = time.time()
        records = daemon.run(label, workflow_yaml(label, items, concurrency))
        t1 = time.time()
        cpu1 = _cpu(daemon.proc.pid)
        ok = [r for r in records if r.get("ev") == "finished" and r.get("result") == "success"]
        if len(ok) != n:
            bad = [r for r in records if r.get("ev") == "finished" and r.get("result") != "success"]
            raise RuntimeError(f"{label}: {len(ok)}/{n} items succeeded: {bad[:2]}")
        window = self.api.since(start)
        firsts = first_requests(window)
        accepted = {r["item"]: epoch(r["at"]) for r in records if r.get("ev") == "accepted"}
        span = run_span(records)
        return {
            "label": label,
            "n": n,
            "span_s": span,
            "rate": n / span,
            "wall_s": t1 - t0,  # the drop of the file to the run's record seen in runs.jsonl
            "latency_s": [firsts[i] - accepted[i] for i in items],
            "cpu_self_s": cpu1[0] - cpu0[0],
            "cpu_children_s": cpu1[1] - cpu0[1],
            "prefix": prefixes(window),
            "tools": tool_results(window),
            "requests": len(window),
        }

    def bare(self, worker: BareWorker, n: int, concurrency: int) -> dict[str, Any]:
        label = self._label("bare")
        items = [f"{label}-i{j:02d}" for j in range(n)]
        start = len(self.api.requests)
        spec = {
            "append": self.append,
            "cwd": self.bare_cwd,
            "env": self.bare_env,
            "concurrency": concurrency,
            "prompts": [[item, _brief(self.root, label, item)] for item in items],
        }
        out = worker.run(spec)
        if out["failures"]:
            raise RuntimeError(f"{label}: {len(out['failures'])} sessions failed: {out['failures'][:2]}")
        window = self.api.since(start)
        firsts = first_requests(window)
        span = out["t1"] - out["t0"]
        return {
            "label": label,
            "n": n,
            "span_s": span,
            "rate": n / span,
            "latency_s": [firsts[i] - out["started"][i] for i in items],
            "cpu_self_s": out["cpu_self_s"],
            "cpu_children_s": out["cpu_children_s"],
            "prefix": prefixes(window),
            "tools": tool_results(window),
            "requests": len(window),
        }


def until_idle(bench: Bench, n: int) -> dict[str, Any]:
    """``python -m ambient run --until-idle`` on fresh brains holding an ``n``-item and a 1-item workflow."""
    out: dict[str, Any] = {}
    for k in (n, 1):
        read = bench.base / f"idle-{k}" / NOTES if bench.args.tool_step else None
        root = new_brain(bench.base, f"idle-{k}", {AGENT: agent_text(read)}, concurrency=CONCURRENCY)
        (root / NOTES).write_text("# Notes\n")
        items = [f"idle{k}-i{j:02d}" for j in range(k)]
        (root / "workflows" / f"idle-{k}.yml").write_text(workflow_yaml(f"idle-{k}", items, CONCURRENCY))
        t0 = time.perf_counter()
        proc = subprocess.run(
            daemon_argv(root, "--until-idle"), env=bench.env, capture_output=True, timeout=600, check=False
        )
        wall = time.perf_counter() - t0
        summary = [json.loads(x) for x in (root / ".ambient" / "runs.jsonl").read_text().splitlines() if x.strip()]
        if proc.returncode != 0 or not summary or summary[0].get("outcome") != "success":
            raise RuntimeError(f"--until-idle on {k} items: rc {proc.returncode} {proc.stderr[-1000:]!r}")
        out[f"wall_{k}_s"] = wall
    out["per_agent_s"] = (out[f"wall_{n}_s"] - out["wall_1_s"]) / (n - 1) if n > 1 else float("nan")
    return out


def launcher_startup(bench: Bench, rounds: int = 15) -> dict[str, float]:
    """Ambient starts each CLI through ``.ambient/claude/launch`` (``from ambient.runners.claude_launch import
    main``); timed exec'ing ``/bin/true`` (wall and CPU, medians), against the same module run as a file with
    ``python -I -S`` (what a launcher importing nothing of ambient's package would cost) and ``/bin/true`` alone."""
    launch = bench.root / ".ambient" / "claude" / "launch"
    if not launch.exists():
        return {}
    from ambient.runners import claude_launch

    env = bench.env | {"AMBIENT_CLAUDE_CLI": "/bin/true", "AMBIENT_CLAUDE_KEEP": ""}
    env["AMBIENT_CLAUDE_PARENT"] = str(os.getpid())
    ways = {
        "launcher": [str(launch)],
        "module_file": [PY, "-I", "-S", str(claude_launch.__file__)],
        "true": ["/bin/true"],
    }
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, argv in ways.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True)
            wall[name].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    out = {f"{k}_ms": median(v) * 1000 for k, v in wall.items()}
    out |= {f"{k}_cpu_ms": median(v) * 1000 for k, v in cpu.items()}
    return out


def gateway_overhead(base: Path, rounds: int = 200) -> dict[str, Any]:
    """The model gateway's cost per call: the same request straight to the fake API (no delay) and through a
    ``ModelGateway`` whose record hook appends the call to a file with an fsync (as the run journal does), in
    pairs, interleaved; streamed (SSE) and not. Per pair: through minus straight."""
    import httpx

    from ambient.runners.gateway import ModelGateway, Upstream, upstream_auth
    from ambient.storage.journal import append_line
    from ambient.testing.fakeapi import FakeAnthropic

    ledger = base / "gateway-calls.jsonl"

    class Hooks:
        def admit(self, grant: Any) -> str | None:
            return None

        async def record(self, grant: Any, call: Any) -> None:
            await asyncio.to_thread(append_line, ledger, {"ev": "call", **call.to_record()}, durable=True)

    async def run() -> dict[str, Any]:
        gateway = ModelGateway(Hooks())
        await gateway.start()
        upstream = Upstream("anthropic", api.url, upstream_auth("anthropic", None, "sk-bench"))
        grant = gateway.grant(run_id="r", item="i", attempt=1, agent="a", key="r/i/1", upstream=upstream)
        out: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient() as client:
                for stream in (False, True):
                    body = {"model": "claude-haiku-4-5", "max_tokens": 64, "stream": stream, "system": "bench"}
                    body["messages"] = [{"role": "user", "content": "Item: x\n" + "words " * 200}]
                    straight: list[float] = []
                    through: list[float] = []
                    for n in range(rounds + 5):
                        for url, key, into in ((api.url, "sk-bench", straight), (gateway.url, grant.token, through)):
                            t0 = time.perf_counter()
                            resp = await client.post(f"{url}/v1/messages", json=body, headers={"x-api-key": key})
                            resp.raise_for_status()
                            if n >= 5:  # warm-up left out
                                into.append(time.perf_counter() - t0)
                    extra = [b - a for a, b in zip(straight, through, strict=True)]
                    name = "stream" if stream else "json"
                    out[name] = {"straight": straight, "through": through, "extra": extra}
        finally:
            await gateway.close()
        return out

    with FakeAnthropic() as api:
        return asyncio.run(run())


# ------------------------------------------------------------------------------------------------------ reporting


def _ms(values: Sequence[float]) -> str:
    return f"median {median(values) * 1000:.0f} ms, p90 {pct(values, 0.9) * 1000:.0f} ms"


def _per_agent_cpu(runs: Sequence[dict[str, Any]]) -> tuple[float, float]:
    n = sum(r["n"] for r in runs)
    return (sum(r["cpu_self_s"] for r in runs) / n * 1000, sum(r["cpu_children_s"] for r in runs) / n * 1000)


def report_gateway(found: dict[str, Any]) -> None:
    """The model gateway's cost per call (see :func:`gateway_overhead`)."""
    for name, label in (("json", "a JSON answer"), ("stream", "a streamed (SSE) answer")):
        got = found[name]
        print(
            f"model gateway, {label}: straight {_ms(got['straight'])}; through the gateway {_ms(got['through'])}; "
            f"per call +{median(got['extra']) * 1000:.2f} ms median, +{pct(got['extra'], 0.9) * 1000:.2f} ms p90 "
            f"({len(got['extra'])} pairs, the record's fsync included)"
        )


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    amb, bare = out["ambient"], out["bare"]
    rows = [("", "ambient", "bare SDK", "ambient/bare")]
    ra, rb = median(r["rate"] for r in amb), median(r["rate"] for r in bare)
    rows.append(
        (
            f"agents/s, N={args.n}, concurrency {CONCURRENCY} (median of {len(amb)})",
            f"{ra:.2f}",
            f"{rb:.2f}",
            f"{out['ratio']:.2f} (pairs {', '.join(f'{x:.2f}' for x in out['ratios'])})",
        )
    )
    rows.append(
        (
            "  runs, s",
            ", ".join(f"{r['span_s']:.2f}" for r in amb),
            ", ".join(f"{r['span_s']:.2f}" for r in bare),
            "",
        )
    )
    ca, cb = _per_agent_cpu(amb), _per_agent_cpu(bare)
    rows.append(
        (
            "CPU per agent: process / Claude Code",
            f"{ca[0]:.0f} / {ca[1]:.0f} ms",
            f"{cb[0]:.0f} / {cb[1]:.0f} ms",
            f"{(ca[0] + ca[1]) / (cb[0] + cb[1]):.2f}",
        )
    )
    la = [x for r in amb for x in r["latency_s"]]
    lb = [x for r in bare for x in r["latency_s"]]
    rows.append(
        ("SPAWN -> 1st request, concurrency 4", _ms(la), _ms(lb), f"{(median(la) - median(lb)) * 1000:+.0f} ms")
    )
    sa = [x for r in out["singles_ambient"] for x in r["latency_s"]]
    sb = [x for r in out["singles_bare"] for x in r["latency_s"]]
    if sa and sb:
        rows.append(
            (
                f"SPAWN -> 1st request, alone (x{len(sa)})",
                _ms(sa),
                _ms(sb),
                f"{(median(sa) - median(sb)) * 1000:+.0f} ms",
            )
        )
        rows.append(
            (
                "one item alone, run span",
                f"{median(r['span_s'] for r in out['singles_ambient']) * 1000:.0f} ms",
                f"{median(r['span_s'] for r in out['singles_bare']) * 1000:.0f} ms",
                "",
            )
        )
    pa = [r["prefix"] for r in amb]
    pb = [r["prefix"] for r in bare]
    rows.append(
        (
            f"distinct system prefixes in {args.n} main requests",
            ", ".join(str(p["distinct_system"]) for p in pa),
            ", ".join(str(p["distinct_system"]) for p in pb),
            "",
        )
    )
    rows.append(
        (
            "  distinct tools+system",
            ", ".join(str(p["distinct_tools_system"]) for p in pa),
            ", ".join(str(p["distinct_tools_system"]) for p in pb),
            "",
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    identical = all(p["distinct_system"] == 1 and p["requests"] == args.n for p in pa)
    print(
        f"prompt-cache prefix byte-identical in all {args.n} main requests of every ambient run: "
        f"{'yes' if identical else 'NO'}"
    )
    if args.tool_step:
        ta = [r["tools"] for r in amb]
        tb = [r["tools"] for r in bare]
        print(
            f"tool calls done: ambient {sum(t['ok'] for t in ta)} ok, {sum(t['error'] for t in ta)} failed; bare "
            f"{sum(t['ok'] for t in tb)} ok, {sum(t['error'] for t in tb)} failed (each agent reads {NOTES} once)"
        )
    walls = [r["wall_s"] for r in amb]
    print(
        f"first (cold) runs of {out['cold_n']} item(s): ambient {out['cold_ambient']['span_s']:.2f} s, "
        f"bare {out['cold_bare']['span_s']:.2f} s; ambient's drop -> record seen, warm runs: "
        f"{', '.join(f'{w:.2f}' for w in walls)} s (span + the watcher's pick-up + the summary)"
    )
    print(f"target ambient >= 0.9 of bare: {'met' if out['ratio'] >= 0.9 else 'MISSED'}")
    if "until_idle" in out:
        u = out["until_idle"]
        print(
            f"ambient run --until-idle, fresh brain: {args.n} items {u[f'wall_{args.n}_s']:.2f} s, 1 item "
            f"{u['wall_1_s']:.2f} s (fixed start-up and stop); beyond it {u['per_agent_s'] * 1000:.0f} ms per agent "
            f"({1 / u['per_agent_s']:.2f} agents/s)"
        )
    if out.get("gateway"):
        report_gateway(out["gateway"])
    if out.get("launcher"):
        lz = out["launcher"]
        print(
            f"launcher .ambient/claude/launch -> exec /bin/true: {lz['launcher_ms']:.0f} ms, CPU "
            f"{lz['launcher_cpu_ms']:.0f} ms; the same module as a file (python -I -S): {lz['module_file_ms']:.0f} ms, "
            f"CPU {lz['module_file_cpu_ms']:.0f} ms; /bin/true alone {lz['true_ms']:.1f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="items per throughput run (default 20)")
    ap.add_argument("--repeats", type=int, default=5, help="warm throughput runs per side, interleaved (default 5)")
    ap.add_argument("--singles", type=int, default=5, help="one-item runs per side, interleaved (default 5)")
    ap.add_argument("--delay-s", type=float, default=0.05, help="the fake API's delay before each reply")
    ap.add_argument("--tool-step", action="store_true", help="each agent makes one Read before its answer")
    ap.add_argument("--unconfined", action="store_true", help="ambient's agent with confine: false (the jail's cost)")
    ap.add_argument("--skip", default="", help="comma list: until-idle,launcher,gateway")
    ap.add_argument("--gateway-only", action="store_true", help="measure the model gateway's cost per call alone")
    ap.add_argument("--dir", default=None, help="where to make the temp brains (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    CONFINED[0] = not args.unconfined
    if args.bare_worker:
        return bare_worker()
    try:
        import claude_agent_sdk  # noqa: F401
    except ImportError:
        print("needs the claude extra: pip install 'ambient[claude]'")
        return 1
    skip = set(filter(None, args.skip.split(",")))
    if args.gateway_only:
        with TempDir(args.dir, args.keep) as base:
            load0 = os.getloadavg()[0]
            found = gateway_overhead(base)
            print(f"{os.cpu_count()} cores, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
            report_gateway(found)
        if args.json:
            Path(args.json).write_text(json.dumps({"gateway": found}, indent=1))
        return 0
    out: dict[str, Any] = {"python": sys.version.split()[0], "delay_s": args.delay_s, "tool_step": args.tool_step}
    t_start = time.perf_counter()
    with TempDir(args.dir, args.keep) as base:
        bench = Bench(base, args)
        worker = BareWorker(base / "bare-worker.log", bench.env)
        try:
            steal = Steal()
            load0 = os.getloadavg()[0]
            with ServingDaemon(bench.root, bench.env, base / "daemon.log") as daemon:
                out["cold_n"] = 1
                out["cold_ambient"] = bench.ambient(daemon, 1, 1)
                out["cold_bare"] = bench.bare(worker, 1, 1)
                out["singles_ambient"], out["singles_bare"] = [], []
                for _ in range(args.singles):
                    out["singles_ambient"].append(bench.ambient(daemon, 1, 1))
                    out["singles_bare"].append(bench.bare(worker, 1, 1))
                out["ambient"], out["bare"] = [], []
                for _ in range(args.repeats):
                    out["ambient"].append(bench.ambient(daemon, args.n, CONCURRENCY))
                    out["bare"].append(bench.bare(worker, args.n, CONCURRENCY))
            steal_text = steal.stop()
            out["steal"] = steal.share
            out["load_1min"] = [load0, os.getloadavg()[0]]
            out["ratios"] = [a["rate"] / b["rate"] for a, b in zip(out["ambient"], out["bare"], strict=True)]
            out["ratio"] = median(out["ratios"])
            if "launcher" not in skip:
                out["launcher"] = launcher_startup(bench)
            if "until-idle" not in skip:
                out["until_idle"] = until_idle(bench, args.n)
            if "gateway" not in skip:
                out["gateway"] = gateway_overhead(base)
        finally:
            worker.close()
            bench.close()
        print(
            f"Claude Code {_cli_version()} against FakeAnthropic (delay {args.delay_s:g} s per reply"
            f"{', one Read per agent' if args.tool_step else ', no tool call'}); {os.cpu_count()} cores, "
            f"load average {out['load_1min'][0]:.1f} -> {out['load_1min'][1]:.1f} (others' work competes){steal_text}"
        )
        report(out, args)
        print(f"(bench wall time {time.perf_counter() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _cli_version() -> str:
    from ambient.runners.claude import bundled_cli

    cli = bundled_cli()
    version = cli.parent / "claude.version" if cli is not None else None
    with contextlib.suppress(OSError):
        if version is not None:
            return version.read_text().strip()
    return "?"


if __name__ == "__main__":
    raise SystemExit(main())
