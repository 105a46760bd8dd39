"""``kind: claude``: the agent's prompt runs on Claude Code, through the Claude Agent SDK (the ``claude`` extra).

One SPAWN is one Claude Code session (or the resumption of one):

- the system prompt is Claude Code's preset with the agent's markdown body and ambient's answer contract appended
  (``system_prompt: replace``: body and contract alone); the user prompt is the brief (:mod:`ambient.runners.prompt`);
- every tool call goes through ``can_use_tool`` and :func:`ambient.runners.permissions.check_tool`: allowed, denied
  (the agent is told why; the live thread records it) or a question for the person. A question ends the session at
  once (the tool call is interrupted) and the item answers ESCALATE with ``allow | allow always | deny``; the answer
  comes back as ``payload.context.decision`` and the session is *resumed*: the call the person allowed goes through
  (a grant matches the digest of the whole call; after commands of one shape, the question also offers their
  pattern, :mod:`ambient.runners.patterns`), a denial is said to the agent, which ends as it chooses. Nothing
  waits in memory, so an answer given after a restart, a day later, resumes the same way;
- the session id is on disk as soon as Claude Code announces it (``.ambient/claude/items/``): a retry or an item
  interrupted by a restart resumes the session when its transcript is still there, else starts afresh; the resumed
  session is told why it runs again, as the run journal says (``RunRequest.resumed``: the person's answer and the
  question, a retry and its error, a stop or a crash of ambient);
- Claude Code's own state lives in the agent's session folder, ``.ambient/claude/agents/<agent>/``
  (``CLAUDE_CONFIG_DIR``, ``HOME``), never in the person's home, and a private temp dir (``TMPDIR``); the CLI is
  started through :mod:`ambient.runners.claude_launch` (clean environment, dies with the daemon) which confines it
  under Landlock like a command agent (:mod:`ambient.runners.confinement`: it and every command it runs write only
  the scope, the session folder and the temp dir, read nothing of ``.ambient/`` but that folder nor the secrets of
  ``profil/``, bind no TCP port and connect only to the model API's port and those of ``network:``);
- every model call goes through ambient's model gateway (:mod:`ambient.runners.gateway`) when the daemon runs one:
  the CLI's ``ANTHROPIC_BASE_URL`` is the gateway and its key the attempt's grant, never the real key; the
  attempt's usage is what the gateway metered (a timed-out or killed session included, a resumed one counting only
  its own calls), not what Claude Code reports;
- each assistant message, tool call and tool result is reported to ``watch`` (the agent's live thread); the final
  answer maps onto RETURN / ESCALATE / BLOCKED_ON / ERROR (:mod:`ambient.runners.answer`) with its usage and cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ambient.core.errors import AmbientError, InputError
from ambient.core.lazylog import get_logger
from ambient.runners import claude_launch, confinement, patterns, permissions
from ambient.runners.answer import final_answer
from ambient.runners.base import RunRequest, Watch
from ambient.runners.gateway import Grant, ModelGateway, Upstream, metered, upstream_auth
from ambient.runners.keys import credential
from ambient.runners.prompt import (
    ANSWER_SCHEMA,
    AgentPrompt,
    read_agent_prompt,
    render_brief,
    resume_note,
    system_prompt,
)
from ambient.runners.result import AgentResult, Reason, Usage, error_result
from ambient.runners.runner_config import ClaudeRunnerConfig, network_ports
from ambient.storage.fsutil import atomic_write, read_capped
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

#: The extra that brings the SDK (and, in its wheel, the Claude Code CLI).
EXTRA_HINT = "pip install 'ambient[claude]'"
#: What Claude Code is told when ambient stops a tool call to ask the person.
WAITING = "ambient stopped this tool call to ask the person; you will be resumed with their answer."
#: Environment names of the model's credentials, passed to the CLI when the daemon has them.
KEY_NAMES = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN")
#: Every model key ambient may hand an AI runner: masked in whatever agents say (the daemon registers them).
MODEL_KEYS = (*KEY_NAMES, "OPENAI_API_KEY")
#: Other variables of the daemon's environment the CLI may use (routing, not secrets of the person).
PASSED = ("ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX")
_MAX_STATE_BYTES = 256 * 1024
#: Commands kept per agent among those the person allowed (``allowed.json``), the newest: what patterns come from.
ALLOWED_KEPT = 30
_MAX_ALLOWED_BYTES = 1024 * 1024
_WATCH_CHARS = 1000


def bundled_cli() -> Path | None:
    """The Claude Code CLI shipped in the SDK's wheel, else ``claude`` on PATH, else None."""
    try:
        import claude_agent_sdk
    except ImportError:
        return None
    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if bundled.is_file():
        return bundled
    import shutil

    found = shutil.which("claude")
    return Path(found) if found else None


@dataclass
class ItemSession:
    """What survives of an item's Claude session between attempts: its id, the tool call waiting on the person,
    and what the person allowed for this item (the digests of those calls, :func:`permissions.call_digest`)."""

    session_id: str | None = None
    pending: dict[str, Any] | None = None
    granted: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(
            {"session_id": self.session_id, "pending": self.pending, "granted": self.granted}, sort_keys=True
        ).encode()


class SessionStore:
    """``.ambient/claude/items/<digest>.json`` per (run, item), ``grants.json`` for ``allow always`` and the
    patterns the person accepted, ``allowed.json`` for the commands they allowed (what a pattern is offered from)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.items = root / "items"

    def _path(self, run_id: str, item: str) -> Path:
        digest = hashlib.sha256(f"{run_id}\x1f{item}".encode()).hexdigest()[:32]
        return self.items / f"{digest}.json"

    def load(self, run_id: str, item: str) -> ItemSession:
        try:
            data = json.loads(read_capped(self._path(run_id, item), _MAX_STATE_BYTES))
        except (OSError, ValueError, AmbientError):
            return ItemSession()
        if not isinstance(data, dict):
            return ItemSession()
        sid = data.get("session_id")
        pending = data.get("pending")
        granted = data.get("granted")
        digests = [permissions.grant_digest(g) for g in granted] if isinstance(granted, list) else []
        return ItemSession(
            session_id=sid if isinstance(sid, str) else None,
            pending=pending if isinstance(pending, dict) else None,
            granted=[d for d in digests if d is not None],
        )

    def save(self, run_id: str, item: str, state: ItemSession) -> None:
        """Durable before ambient acts on it: a question is asked only once its tool call is on disk."""
        self.items.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self._path(run_id, item), state.to_json(), mode=0o600)

    def grants(self, agent: str) -> frozenset[str]:
        """What the person allowed ``agent`` for good (``allow always``): the digests of those calls (an old grant
        without one counts only when it cannot be a cut signature, :func:`permissions.grant_digest`)."""
        return frozenset(g["sha256"] for g in self._entries().get(agent, []) if "sha256" in g)

    def patterns(self, agent: str) -> tuple[str, ...]:
        """The command patterns the person allowed ``agent`` for good (:mod:`ambient.runners.patterns`)."""
        return tuple(g["pattern"] for g in self._entries().get(agent, []) if "pattern" in g)

    def grant_always(self, agent: str, call: str, digest: str | None = None) -> None:
        """Allow ``agent`` the call of this digest for good (default: the digest of ``call``, its whole signature,
        which is what the person reads in ``ambient grants``)."""
        digest = digest or permissions.digest_of(call)
        data = self._entries()
        mine = data.setdefault(agent, [])
        if all(g.get("sha256") != digest for g in mine):
            mine.append({"call": call, "sha256": digest})
        self._write(data)

    def grant_pattern(self, agent: str, pattern: str) -> None:
        """Allow ``agent`` every command ``pattern`` stands for, for good (the person accepted it, offered with a
        question: :func:`permissions.pattern_option`)."""
        data = self._entries()
        mine = data.setdefault(agent, [])
        if all(g.get("pattern") != pattern for g in mine):
            mine.append({"call": permissions.PATTERN_PREFIX + pattern, "pattern": pattern})
        self._write(data)

    def all_grants(self) -> dict[str, list[str]]:
        """Every ``allow always`` that still matches a call, and every pattern, by agent, as the person reads it."""
        return {a: [g["call"] for g in v] for a, v in self._entries().items() if v}

    def forget(self, agent: str, call: str | None = None) -> int:
        """Drop the grants of ``agent`` whose call (as listed), digest or pattern is ``call`` (all of them when
        None): that call is a question again. A pattern forgotten takes the commands it was offered from with it
        (:meth:`allowed`): it is offered again only after the person allows as many anew. How many were dropped."""
        data = self._entries()
        mine = data.get(agent, [])
        kept = [g for g in mine if call is not None and call not in (g["call"], g.get("sha256"), g.get("pattern"))]
        if len(kept) == len(mine):
            return 0
        if kept:
            data[agent] = kept
        else:
            data.pop(agent, None)
        self._write(data)
        gone = [g["pattern"] for g in mine if "pattern" in g and g not in kept]
        if gone:
            self._forget_allowed(agent, gone)
        return len(mine) - len(kept)

    def allowed(self, agent: str) -> tuple[str, ...]:
        """The plain commands the person allowed ``agent`` (``allow`` or ``allow always``), the newest last, at most
        :data:`ALLOWED_KEPT`: what a pattern is offered from (:func:`ambient.runners.patterns.offer`)."""
        found = self._allowed().get(agent)
        return tuple(c for c in found if isinstance(c, str)) if isinstance(found, list) else ()

    def remember_allowed(self, agent: str, command: str) -> None:
        """Keep ``command`` among those the person allowed ``agent`` (a command no pattern may stand for is not
        kept: it would never count)."""
        if patterns.words(command) is None or len(command) > patterns.MAX_PATTERN_CHARS:
            return
        data = self._allowed()
        mine = [c for c in self.allowed(agent) if c != command] + [command]
        data[agent] = mine[-ALLOWED_KEPT:]
        self._write_allowed(data)

    def _forget_allowed(self, agent: str, gone: list[str]) -> None:
        data = self._allowed()
        data[agent] = [c for c in self.allowed(agent) if not any(patterns.matches(p, c) for p in gone)]
        self._write_allowed(data)

    def _allowed(self) -> dict[str, Any]:
        try:
            data = json.loads(read_capped(self.root / "allowed.json", _MAX_ALLOWED_BYTES))
        except (OSError, ValueError, AmbientError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_allowed(self, data: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        body = json.dumps({a: v for a, v in data.items() if v}, indent=2, sort_keys=True).encode()
        atomic_write(self.root / "allowed.json", body, mode=0o600)

    def _entries(self) -> dict[str, list[dict[str, str]]]:
        """``grants.json`` read as ``{agent: [{"call", "sha256"} or {"call", "pattern"}]}``: an old bare signature
        gets the digest it may still match, or is dropped when it may be a cut one; a pattern that breaks the
        rules of :func:`ambient.runners.patterns.parse` is dropped."""
        out: dict[str, list[dict[str, str]]] = {}
        for agent, found in self._grants().items():
            if not isinstance(agent, str) or not isinstance(found, list):
                continue
            mine: list[dict[str, str]] = []
            for entry in found:
                pattern = permissions.grant_pattern(entry)
                if pattern is not None:
                    if all(g.get("pattern") != pattern for g in mine):
                        mine.append({"call": permissions.PATTERN_PREFIX + pattern, "pattern": pattern})
                    continue
                digest = permissions.grant_digest(entry)
                shown = permissions.grant_display(entry)
                if digest is not None and shown is not None and all(g.get("sha256") != digest for g in mine):
                    mine.append({"call": shown, "sha256": digest})
            out[agent] = mine
        return out

    def _write(self, data: dict[str, list[dict[str, str]]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self.root / "grants.json", json.dumps(data, indent=2, sort_keys=True).encode(), mode=0o600)

    def _grants(self) -> dict[str, Any]:
        try:
            data = json.loads(read_capped(self.root / "grants.json", _MAX_STATE_BYTES))
        except (OSError, ValueError, AmbientError):
            return {}
        return data if isinstance(data, dict) else {}


def transcript_exists(config_dir: Path, session_id: str) -> bool:
    """Whether Claude Code still has the session's transcript (``projects/<cwd>/<id>.jsonl``) to resume from."""
    if not session_id or "/" in session_id or session_id.startswith("."):
        return False
    with contextlib.suppress(OSError):
        return any((d / f"{session_id}.jsonl").is_file() for d in (config_dir / "projects").iterdir())
    return False


@dataclass
class _Attempt:
    """One session's running facts, filled as its messages arrive."""

    req: RunRequest
    ctx: permissions.ToolContext
    asked: permissions.Verdict | None = None
    asked_call: dict[str, Any] | None = None
    denied: list[str] = field(default_factory=list)
    session_id: str | None = None
    model: str | None = None
    texts: list[str] = field(default_factory=list)
    tool: str | None = None
    unreachable: int = 0  # connection failures in a row (see _refusal)
    quiet: set[str] = field(default_factory=set)  # tool calls not shown in the thread (StructuredOutput)


class ClaudeRunner:
    """Carries out SPAWNs of ``kind: claude`` agents (see the module docstring)."""

    def __init__(
        self,
        paths: BrainPaths,
        *,
        environ: Mapping[str, str] | None = None,
        watch: Watch | None = None,
        gateway: ModelGateway | None = None,
        current: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.paths = paths
        self.gateway = gateway  # every model call through it, metered, when started (ambient.runners.gateway)
        self.environ = dict(os.environ if environ is None else environ)
        self.watch = watch
        self.home = paths.state / "claude"
        self.sessions = SessionStore(self.home)
        #: Per running SPAWN key: the tool call in progress (run, item, agent, tool, since) for ``ambient status``.
        # What each agent is doing now, by attempt: ``current`` is the daemon's own map (its live turns write it out).
        self.current: dict[str, dict[str, Any]] = {} if current is None else current
        self._launcher_ready = False
        #: ``learning.pattern_after``: commands of one shape the person allows before a pattern is offered (0: never).
        self.pattern_after = patterns.DEFAULT_PATTERN_AFTER

    # -- the run

    async def run(self, req: RunRequest, cfg: ClaudeRunnerConfig) -> AgentResult:
        started = time.monotonic()
        try:  # ~0.6 s of CPU the first time: in a thread, so no run waits on it
            await asyncio.to_thread(importlib.import_module, "claude_agent_sdk")
        except ImportError:
            return error_result("spawn_failed", f"kind: claude needs the Claude Agent SDK: {EXTRA_HINT}")
        cli = bundled_cli()
        if cli is None:
            return error_result("spawn_failed", "the Claude Code CLI is not found (the SDK's wheel bundles it)")
        try:
            prompt = read_agent_prompt(req.prompt_file) if req.prompt_file is not None else AgentPrompt(body="")
        except (OSError, InputError) as exc:
            return error_result("bad_request", f"cannot read the agent's prompt: {exc}")
        grant = self._grant(req, cfg, prompt)
        try:
            res = await asyncio.wait_for(self._session(req, cfg, prompt, cli, grant), cfg.timeout_s)
        except TimeoutError:
            res = error_result(
                "timeout",
                f"the agent ran over its timeout of {cfg.timeout_s:g} s (the workflow's timeout:, else the runner's "
                "timeout_s) and was stopped",
                killed=True,
            )
        finally:
            self.current.pop(req.key, None)
            if grant is not None and self.gateway is not None:
                await self.gateway.release(grant)
        if grant is not None:
            res = metered(res, grant)
        return replace(res, duration_ms=int((time.monotonic() - started) * 1000))

    def _grant(self, req: RunRequest, cfg: ClaudeRunnerConfig, prompt: AgentPrompt) -> Grant | None:
        """The attempt's key to the model gateway (None: no gateway, or Claude Code talks to Bedrock or Vertex,
        which the gateway does not speak): the real key stays with the gateway."""
        gateway = self.gateway
        if gateway is None or not gateway.started:
            return None
        if any(self.environ.get(n) or cfg.env.get(n) for n in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX")):
            return None
        auth: tuple[tuple[str, str], ...] = ()
        for name in KEY_NAMES:
            value = cfg.env.get(name) or credential(name, self.environ)
            if value:
                auth = upstream_auth("anthropic", name, value)
                break
        return gateway.grant(
            run_id=req.run_id,
            item=req.item,
            attempt=req.attempt,
            agent=req.agent,
            key=req.key,
            upstream=Upstream("anthropic", self._api_url(cfg), auth),
            price=None,
            model=cfg.model or prompt.model,
        )

    async def _session(
        self, req: RunRequest, cfg: ClaudeRunnerConfig, prompt: AgentPrompt, cli: Path, grant: Grant | None
    ) -> AgentResult:
        state = await asyncio.to_thread(self.sessions.load, req.run_id, req.item)
        pending_before = state.pending
        note = self._take_answer(req, state)
        if state.pending != pending_before:  # the answer is applied: on disk before the session acts on it
            await asyncio.to_thread(self.sessions.save, req.run_id, req.item, state)
        config_dir = self.session_dir(req.agent) / "config"
        resume = state.session_id if state.session_id and transcript_exists(config_dir, state.session_id) else None
        if resume is None and state.session_id is not None:
            note = f"{note or ''} (your previous session could not be resumed; start the task again)".strip()
        elif resume is not None and note is None:
            note = resume_note(req.resumed)  # why it runs again, as the run journal says: never a guess
        granted = frozenset(state.granted) | await asyncio.to_thread(self.sessions.grants, req.agent)
        known = await asyncio.to_thread(self.sessions.patterns, req.agent)
        allowed_before = await asyncio.to_thread(self.sessions.allowed, req.agent)
        workdir = (self.paths.root / cfg.workdir) if cfg.workdir else self.paths.root
        scope = tuple((req.packet.get("scope") or {}).get("files") or ())
        ctx = permissions.ToolContext(
            agent=req.agent,
            brain=self.paths.root.resolve(),
            workdir=workdir.resolve(),
            scope=scope,
            allowed=tuple(cfg.allowed_tools),
            granted=granted,
            patterns=known,
            allowed_before=allowed_before,
            offer_after=self.pattern_after,
        )
        run = _Attempt(req=req, ctx=ctx)
        tmp = await asyncio.to_thread(confinement.private_tmp, req.agent)
        try:
            env = await asyncio.to_thread(self._env, req, cfg, cli, tmp, grant)
            options = self._options(req, cfg, prompt, workdir, run, resume, env)
            return await self._converse(req, cfg, options, run, state, note)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)

    def session_dir(self, agent: str) -> Path:
        """The agent's own folder of Claude Code state (its config and home): the only one of ``.ambient/`` its
        jail lets it read and write (agent names are plain: no slash, no leading dot)."""
        return self.home / "agents" / agent

    async def _converse(
        self,
        req: RunRequest,
        cfg: ClaudeRunnerConfig,
        options: Any,
        run: _Attempt,
        state: ItemSession,
        note: str | None,
    ) -> AgentResult:
        from claude_agent_sdk import ClaudeSDKClient, ClaudeSDKError, ResultMessage

        brief = render_brief(req, note=note)
        result: Any = None
        refused: tuple[Reason, str] | None = None
        try:
            # A client, not query(): leaving its context closes the CLI and every stream of the session, also on a
            # break (a refused key) or a cancellation (timeout, shutdown).
            async with ClaudeSDKClient(options=options) as client:
                await client.query(brief)
                async for message in client.receive_response():
                    refused = _refusal(message, run, self._api_url(cfg))
                    if refused is not None:  # a refused key is never retried (no storm): stop the turn, leave
                        await client.interrupt()
                        break
                    await self._on_message(message, run, state)
                    if isinstance(message, ResultMessage):
                        result = message
        except ClaudeSDKError as exc:
            if run.asked is None:
                return error_result("agent_error", f"Claude Code failed: {str(exc)[:500]}")
        if refused is not None:
            return error_result(refused[0], refused[1])
        usage = _usage(result, run)
        if run.asked is not None and run.asked_call is not None:
            return self._question(run, state, usage)
        state.pending = None
        await asyncio.to_thread(self.sessions.save, req.run_id, req.item, state)
        if result is None:
            return error_result("agent_error", "Claude Code ended without a result", usage=usage)
        if result.is_error:
            return self._failed(result, usage, self._api_url(cfg))
        text = result.result if isinstance(result.result, str) else "\n".join(run.texts)
        answer = final_answer(result.structured_output, text, agent=req.agent)
        return replace(answer, usage=usage)

    def _options(
        self,
        req: RunRequest,
        cfg: ClaudeRunnerConfig,
        prompt: AgentPrompt,
        workdir: Path,
        run: _Attempt,
        resume: str | None,
        env: dict[str, str],
    ) -> Any:
        from claude_agent_sdk import ClaudeAgentOptions, HookMatcher

        text = system_prompt(prompt)
        system: Any = (
            text if cfg.system_prompt == "replace" else {"type": "preset", "preset": "claude_code", "append": text}
        )
        return ClaudeAgentOptions(
            system_prompt=system,
            model=cfg.model or prompt.model,
            tools=list(prompt.tools) if prompt.tools is not None else None,
            disallowed_tools=list(cfg.disallowed_tools),
            permission_mode=cfg.permission_mode,
            max_turns=cfg.max_turns,
            max_budget_usd=cfg.max_budget_usd,
            cwd=str(workdir),
            cli_path=str(self._launcher()),
            env=env,
            setting_sources=[],
            can_use_tool=lambda name, tool_input, _context: self._can_use_tool(run, name, tool_input),
            # Claude Code lets some calls through without asking (a Read inside its working folder: .ambient/ too);
            # this hook sends every call to can_use_tool. A hook that fails blocks the call (fail closed).
            hooks={"PreToolUse": [HookMatcher(matcher=None, hooks=[_ask_every_time], on_failure="block")]},
            resume=resume,
            # The answer as structured output (Claude Code offers a StructuredOutput tool, asks again once if the
            # model writes text instead); the text's last JSON object, or the text itself, is the fallback.
            output_format={"type": "json_schema", "schema": ANSWER_SCHEMA},
            stderr=lambda line: None,
        )

    def _env(
        self, req: RunRequest, cfg: ClaudeRunnerConfig, cli: Path, tmp: Path, grant: Grant | None = None
    ) -> dict[str, str]:
        """What the CLI gets (the launcher drops the rest of the daemon's environment): its state in the agent's
        session folder, its private temp dir, the model's routing and a key (through the gateway: its address and
        the attempt's grant, never the real key; without it, the daemon's), the runner's ``env``, the orphan
        markers, and the jail the launcher applies (:meth:`_jail`)."""
        own = self.session_dir(req.agent)
        for d in (self.home, own.parent, own, own / "config", own / "home"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        env: dict[str, str] = {
            "CLAUDE_CONFIG_DIR": str(own / "config"),
            "HOME": str(own / "home"),
            "TMPDIR": str(tmp),
            "CLAUDE_CODE_TMPDIR": str(tmp),  # else /tmp/claude-<uid>/ and a socket in /tmp/cc-socks/
            "XDG_RUNTIME_DIR": str(tmp),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "AMBIENT_BRAIN": str(req.brain),
            "AMBIENT_RUN_ID": req.run_id,
            "AMBIENT_AGENT": req.agent,
            "AMBIENT_ITEM": req.item,
        }
        if grant is not None and self.gateway is not None:
            env.update({k: v for k, v in cfg.env.items() if k not in (*KEY_NAMES, "ANTHROPIC_BASE_URL")})
            env.update({n: v for n in PASSED if n != "ANTHROPIC_BASE_URL" and (v := self.environ.get(n))})
            env["ANTHROPIC_BASE_URL"] = self.gateway.url
            env["ANTHROPIC_API_KEY"] = grant.token
        else:
            for name in (*PASSED, *KEY_NAMES):
                value = credential(name, self.environ) if name in KEY_NAMES else self.environ.get(name)
                if value:
                    env[name] = value
            if cfg.base_url:
                env["ANTHROPIC_BASE_URL"] = cfg.base_url
            env.update(cfg.env)
        env["AMBIENT_CLAUDE_KEEP"] = ",".join(sorted(env))
        env["AMBIENT_CLAUDE_CLI"] = str(cli)
        env["AMBIENT_CLAUDE_PARENT"] = str(os.getpid())
        jail = self._jail(req, cfg, cli, tmp, own, gateway=grant is not None)
        if jail is not None:
            env["AMBIENT_CLAUDE_JAIL"] = json.dumps(jail)
        return env

    def _jail(
        self, req: RunRequest, cfg: ClaudeRunnerConfig, cli: Path, tmp: Path, own: Path, *, gateway: bool = False
    ) -> dict[str, Any] | None:
        """The Landlock policy the launcher applies before it execs Claude Code (None: unconfined, by ``confine:
        false`` or for want of Landlock here): a command agent's (:func:`ambient.runners.confinement.policy`) with
        the agent's session folder as its own, and TCP to the model API's port (the gateway's, when its calls go
        through it: the real API's port is then closed to it) and those of ``network:``."""
        version = confinement.landlock_abi()
        if not cfg.confine or version <= 0:
            return None
        ports = network_ports(cfg.network)
        api = self.gateway.port if gateway and self.gateway is not None else None
        connect = None if ports is None else tuple(sorted({*ports, api or api_port(self._api_url(cfg))}))
        files = confinement.scope_files(req)
        found = confinement.policy(req.brain, files, tmp, str(cli.resolve()), connect=connect, own=(str(own),))
        module = str(Path(confinement.__file__).parent)  # where landlock.py is, for the launcher's -I interpreter
        return {"read": found.read, "write": found.write, "abi": version, "connect": found.connect, "module": module}

    def _api_url(self, cfg: ClaudeRunnerConfig) -> str:
        """The model API the CLI talks to, by the order :meth:`_env` sets it: the runner's ``env``, its
        ``base_url``, the daemon's environment."""
        return (
            cfg.env.get("ANTHROPIC_BASE_URL")
            or cfg.base_url
            or self.environ.get("ANTHROPIC_BASE_URL")
            or "https://api.anthropic.com"
        )

    def _launcher(self) -> Path:
        """``.ambient/claude/launch``: :mod:`ambient.runners.claude_launch` as a script of its own, run by this
        interpreter with ``-IS`` (no site, no ambient package: 13 ms of start-up instead of ~150 ms importing
        pydantic and friends through ``ambient.runners``, per agent; bench/ai_agents.py). Checked once per daemon,
        not per agent."""
        path = self.home / "launch"
        if self._launcher_ready:
            return path
        source = Path(claude_launch.__file__).read_text(encoding="utf-8")
        text = f"#!{sys.executable} -IS\n{source}"
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(path, text, mode=0o700)
        self._launcher_ready = True
        return path

    # -- permissions

    async def _can_use_tool(self, run: _Attempt, name: str, tool_input: dict[str, Any]) -> Any:
        from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

        if run.asked is not None:  # one question at a time: the session is ending
            return PermissionResultDeny(message=WAITING, interrupt=True)
        verdict = permissions.check_tool(name, tool_input, run.ctx, resolve=_resolve)
        if verdict.action == "allow":
            return PermissionResultAllow()
        if verdict.action == "deny":
            run.denied.append(verdict.reason)
            self._tell(run.req, "denied", verdict.reason)
            log.info("tool_denied", agent=run.req.agent, item=run.req.item, tool=name, reason=verdict.reason)
            return PermissionResultDeny(message=verdict.reason)
        run.asked = verdict
        run.asked_call = {"tool": name, "input": tool_input}
        self._tell(run.req, "denied", f"waiting for the person: {verdict.question}")
        return PermissionResultDeny(message=WAITING, interrupt=True)

    def _take_answer(self, req: RunRequest, state: ItemSession) -> str | None:
        """The person's answer to the pending tool call, applied: a grant, or the words the agent reads."""
        pending = state.pending
        if pending is None:
            return None
        context = (req.packet.get("payload") or {}).get("context") or {}
        decision = context.get("decision")
        if not isinstance(decision, str):
            return None  # resumed without an answer (a restart): the question is still open elsewhere
        tool, tool_input = pending.get("tool"), pending.get("input")
        if isinstance(tool, str) and isinstance(tool_input, dict):  # the whole call, as it was asked about
            full = permissions.full_signature(tool, tool_input)
            digest: str | None = permissions.digest_of(full)
        else:
            full = str(pending.get("signature", ""))
            digest = permissions.grant_digest(pending)
        what = pending.get("question") or full
        offered = pending.get("pattern")
        command = str(tool_input.get("command", "")) if tool == "Bash" and isinstance(tool_input, dict) else None
        offered = offered if isinstance(offered, str) and command and patterns.matches(offered, command) else None
        label = permissions.pattern_option(req.agent, offered) if offered is not None else None
        answer = permissions.answer_of(decision, label)
        state.pending = None
        if answer == "deny":
            return f"{permissions.DENIED_BY_PERSON} (it was: {what})"
        if digest is None:
            return f"{permissions.DENIED_BY_PERSON} (the call asked about could not be read back: ask again)"
        if answer == "always":
            self.sessions.grant_always(req.agent, full, digest)
        elif digest not in state.granted:
            state.granted.append(digest)
        if offered is not None and answer == "pattern":
            self.sessions.grant_pattern(req.agent, offered)
        if command is not None:
            self.sessions.remember_allowed(req.agent, command)
        shown = full if len(full) <= permissions.MAX_SIGNATURE else full[: permissions.MAX_SIGNATURE] + "…"
        return f"The person allowed your tool call ({shown}). Make it again now and go on with the task."

    def _question(self, run: _Attempt, state: ItemSession, usage: Usage | None) -> AgentResult:
        verdict, call = run.asked, run.asked_call
        assert verdict is not None and call is not None
        state.pending = {**call, "signature": verdict.signature, "sha256": verdict.digest, "question": verdict.question}
        options = list(permissions.OPTIONS)
        permission = {
            "tool": call["tool"],
            "signature": verdict.signature,
            "sha256": verdict.digest,
            "session_id": state.session_id,
        }
        if verdict.pattern:  # the broader grant, offered: the person alone may accept it (its own option key)
            state.pending["pattern"] = verdict.pattern
            label = permissions.pattern_option(run.req.agent, verdict.pattern)
            options.append(label)
            permission |= {"pattern": verdict.pattern, "pattern_option": label}
        self.sessions.save(run.req.run_id, run.req.item, state)
        return AgentResult(
            status="escalate",
            options=options,
            question=verdict.question,
            usage=usage,
            permission=permission,
        )

    # -- messages

    async def _on_message(self, message: Any, run: _Attempt, state: ItemSession) -> None:
        """One message of the session: its id goes to disk at once, the rest to the live thread."""
        from claude_agent_sdk import AssistantMessage, SystemMessage, UserMessage

        if isinstance(message, SystemMessage):
            if message.subtype == "init":
                sid = message.data.get("session_id")
                if isinstance(sid, str):
                    run.session_id = sid
                    if sid != state.session_id:
                        state.session_id = sid
                        await asyncio.to_thread(self.sessions.save, run.req.run_id, run.req.item, state)
            elif message.subtype == "api_retry":
                data = message.data
                why = data.get("error_status") or data.get("error") or "connection failed"
                self._tell(run.req, "note", f"the model API failed ({why}); Claude Code retries")
        elif isinstance(message, AssistantMessage):
            self._on_assistant(run, message)
        elif isinstance(message, UserMessage):
            self._on_user(run, message)

    def _on_assistant(self, run: _Attempt, message: Any) -> None:
        from claude_agent_sdk import TextBlock, ToolUseBlock

        run.model = getattr(message, "model", None) or run.model
        for block in message.content:
            if isinstance(block, TextBlock) and block.text.strip():
                run.texts.append(block.text)
                self._tell(run.req, "assistant", block.text)
            elif isinstance(block, ToolUseBlock) and block.name == "StructuredOutput":
                run.quiet.add(block.id)  # the answer itself: the RETURN turn says it
            elif isinstance(block, ToolUseBlock):
                summary = permissions.signature(block.name, block.input)
                run.tool = block.name
                self.current[run.req.key] = {
                    "run_id": run.req.run_id,
                    "item": run.req.item,
                    "agent": run.req.agent,
                    "tool": summary[:200],
                    "since": time.time(),
                }
                self._tell(run.req, "tool_call", summary)

    def _on_user(self, run: _Attempt, message: Any) -> None:
        from claude_agent_sdk import ToolResultBlock

        content = message.content if isinstance(message.content, list) else []
        for block in content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id not in run.quiet:
                text = _result_text(block.content)
                self._tell(run.req, "tool_result", ("error: " if block.is_error else "") + text)
                self.current.pop(run.req.key, None)

    def _tell(self, req: RunRequest, kind: str, text: str) -> None:
        if self.watch is None:
            return
        try:
            self.watch(req, kind, text[:_WATCH_CHARS])
        except Exception as exc:  # noqa: BLE001 - a live-thread failure never fails the agent
            log.warning("watch_failed", error=str(exc))

    def _failed(self, result: Any, usage: Usage | None, url: str) -> AgentResult:
        subtype = str(result.subtype or "")
        words = str(result.result or subtype or "Claude Code reported an error")[:500]
        if getattr(result, "api_error_status", None) == 404:
            return error_result(
                "provider_unreachable",
                f"the model API at {url} answered 404: check ANTHROPIC_BASE_URL (its path) and the model name "
                f"({words})",
                usage=usage,
            )
        if subtype in ("", "success"):
            return error_result("agent_error", f"Claude Code ended with an error: {words}", usage=usage)
        if "max_turns" in subtype or "budget" in subtype:
            return error_result("budget", f"the agent stopped at its limit ({subtype}): {words}", usage=usage)
        return error_result("agent_error", f"Claude Code ended with an error ({subtype}): {words}", usage=usage)


#: Connection failures in a row after which a session stops: Claude Code would go on for about three minutes.
UNREACHABLE_AFTER = 3


def api_port(url: str) -> int:
    """The TCP port of a model API's base URL (443 for https, 80 for http, unless it names one)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return port or (80 if parts.scheme == "http" else 443)


def _refusal(message: Any, run: _Attempt, url: str) -> tuple[Reason, str] | None:
    """Why to stop the session now when the model API refuses the key (Claude Code retries a 401 ten times over
    minutes) or cannot be reached (``UNREACHABLE_AFTER`` connection failures in a row), else None."""
    from claude_agent_sdk import AssistantMessage, SystemMessage

    status: Any = None
    if isinstance(message, SystemMessage) and message.subtype == "api_retry":
        status = message.data.get("error_status")
        if status is None:
            run.unreachable += 1
            if run.unreachable >= UNREACHABLE_AFTER:
                said = str(message.data.get("error") or "")
                error = "connection failed" if said in ("", "unknown") else said
                return "provider_unreachable", (
                    f"the model API at {url} cannot be reached ({error}, {run.unreachable} tries): check "
                    "ANTHROPIC_BASE_URL and the network, then retry"
                )
            return None
    elif isinstance(message, AssistantMessage) and message.error in ("authentication_failed", "billing_error"):
        status = message.error
    run.unreachable = 0
    if status not in (401, 403, "authentication_failed", "billing_error"):
        return None
    return "provider_refused", (
        f"the key for provider anthropic is refused ({status}): check ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) "
        "in the daemon's environment or $CREDENTIALS_DIRECTORY, then retry"
    )


async def _ask_every_time(_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
    """PreToolUse: no call is decided by Claude Code itself; each one goes to ``can_use_tool``."""
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask"}}


def _resolve(path: str, base: Path) -> Path:
    """A tool's path made absolute and resolved through symlinks (a link in the brain pointing out is out)."""
    return Path(os.path.realpath(permissions.normal_path(path, base)))


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(c.get("text", "")) for c in content if isinstance(c, dict)]
        return " ".join(p for p in parts if p)
    return ""


def _usage(result: Any, run: _Attempt) -> Usage | None:
    if result is None:
        return Usage(model=run.model, session_id=run.session_id) if run.model else None
    u = result.usage if isinstance(result.usage, dict) else {}
    model = run.model
    if isinstance(result.model_usage, dict) and result.model_usage:
        model = next(iter(result.model_usage))
    return Usage(
        model=model,
        input_tokens=int(u.get("input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_tokens=int(u.get("cache_read_input_tokens") or 0),
        cache_write_tokens=int(u.get("cache_creation_input_tokens") or 0),
        cost_usd=float(result.total_cost_usd) if result.total_cost_usd is not None else None,
        turns=int(result.num_turns or 0),
        session_id=result.session_id or run.session_id,
    )
