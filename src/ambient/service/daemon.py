"""The composition root: one daemon per brain, from start-up to a staged shutdown. Holds no domain rules.

Start-up: refuse untrusted filesystems → take the single-instance lock (flock, names the pid) →
sweep crash leftovers (temp files only) → load the brain → remove locks whose holders are gone →
resume every unfinished run from its journal (the reconciliation pass) → start the watcher, the tick loop,
the outbox and the watchdog → ``READY=1``. SIGTERM/SIGINT: ``STOPPING=1``, stop starting work, give running
agents the grace period, kill their process groups, record them as interrupted, release locks, flush. SIGHUP:
``RELOADING=1``, reload configuration, agents, routing and workflows (a broken file keeps the old
version), ``READY=1``. ``until_idle``: stop by itself once nothing can move without the person.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ambient.claims.breakers import Breaker
from ambient.claims.locks import LockManager
from ambient.claims.store import ClaimStore
from ambient.cluster.dispatch import Dispatcher
from ambient.config.brain import Brain, load_brain, reload_workflows
from ambient.config.settings import Settings, settings_changes
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import AmbientError
from ambient.core.health import resource_of
from ambient.core.redact import SecretRegistry
from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.compile import chain_steps, fanout, item_template, retry_policy
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import FanOut
from ambient.engine.ports import Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState
from ambient.engine.spend import SpendMeter
from ambient.engine.themebranch import GitBranches
from ambient.engine.tick import TriggerEngine
from ambient.human.channelstate import digests, secrets_changed
from ambient.human.escalation_store import EscalationStore
from ambient.human.messages import Message
from ambient.human.outbox import Outbox
from ambient.kernel import sendsocket
from ambient.kernel.channels import ChannelRegistry
from ambient.kernel.router import Router
from ambient.live.context import LiveContext
from ambient.runners import CommandRunner, Runners
from ambient.runners.assisted import AssistedRunner
from ambient.runners.claude import KEY_NAMES as CLAUDE_KEYS
from ambient.runners.claude import MODEL_KEYS, ClaudeRunner
from ambient.runners.confinement import AGENT_USER, default_agent_user, ensure_agent_user, landlock_abi, run_as
from ambient.runners.gateway import ModelGateway
from ambient.runners.keys import credential, key_name
from ambient.runners.llm import LlmRunner
from ambient.runners.spawner import Spawner
from ambient.runners.spawner import available as spawner_available
from ambient.service import envblock, statemodes, systemd
from ambient.service.adapters import AgentDelegate, BrainRef, RouterEmitter
from ambient.service.claims_writer import ClaimsWriter
from ambient.service.digest import Digest
from ambient.service.escalator import Learner, StoreEscalator, stored_questions
from ambient.service.evaluators import (
    EscalationEvaluator,
    IdleEvaluator,
    InboxEvaluator,
    StaleClaimsEvaluator,
    WorkflowEvaluator,
)
from ambient.service.heap import HeapTrimEvaluator, freeze_startup_heap
from ambient.service.instance import SingleInstance
from ambient.service.limits import limits_short, raise_descriptor_limit
from ambient.service.live_turns import LiveTurns
from ambient.service.logs import configure_logging
from ambient.service.metering import RunMetering
from ambient.service.notifications import NotifyService
from ambient.service.packets import PacketDesk
from ambient.service.querykeeper import QueryKeeper
from ambient.service.signals import SignalTrap
from ambient.service.starts import RunStarts
from ambient.service.stopping import GUARD_AT_S, STOP_BOUND_S, WRITE_OUT_S, StopGuard, time_left
from ambient.service.troubles import Troubles
from ambient.service.watch import watch_brain
from ambient.storage.fsutil import check_local_filesystem, check_state, sweep_stale_tmp
from ambient.storage.journal import Journal, append_line
from ambient.storage.paths import BrainPaths
from ambient.workflows.fields import SATELLITE_TYPES
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow, parse_workflow
from ambient.workflows.templating import render, render_path

log = structlog.get_logger(__name__)


@dataclass
class DaemonOptions:
    """How ``ambient run`` was asked to run."""

    until_idle: bool = False
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    watch: bool = True
    progress: Callable[[str], None] | None = None  # live progress lines (a terminal)
    log_level: str | None = None  # --log-level: wins over the file's at every reload
    log_format: str | None = None  # --log-format: idem
    exits_after: bool = False  # the process ends when serve() returns (the CLI): stop signals stay ignored till then
    #: The process is the daemon's own (the CLI): the secrets the settings read leave ``os.environ`` once read
    #: (``environ`` keeps them), so no child inherits them (:func:`ambient.service.envblock.forget`).
    forget_secrets: bool = False


class Daemon:
    """One ambient daemon on one brain."""

    engine: TriggerEngine

    def __init__(self, root: Path, options: DaemonOptions | None = None, clock: Clock | None = None) -> None:
        self.paths = BrainPaths(root.absolute())
        self.options = options or DaemonOptions()
        self.clock = clock or SystemClock()
        self.stop = asyncio.Event()
        self.reload_requested = False
        self.started = False
        self.secrets = SecretRegistry()
        self._instance = SingleInstance(self.paths)
        self._tasks: list[asyncio.Task[object]] = []
        self._problems_seen: set[str] = set()
        self._failed_task: str | None = None  # a daemon task that died: the exit code says so
        self._send_server: asyncio.AbstractServer | None = None
        self._trap: SignalTrap | None = None
        self._key_digests: dict[str, str] | None = None  # the model keys' hashes at the last load (reload compares)

    # -- wiring

    def _build(self) -> None:
        p = self.paths
        env = self.options.environ
        brain = load_brain(p, env)
        self._report(brain)
        if not brain.settings_ok:  # no previous version to keep: every valid key of the file, the rest defaults
            log.error("config_invalid_valid_keys_used", file=p.rel(p.config))
        self.ref = BrainRef(brain)
        s = brain.settings
        self.router = Router(
            brain.matrix.matrix,
            zone_rules=brain.matrix.zone_rules,
            audit=Journal(p.audit),
            brain_root=p.root,
            registry=ChannelRegistry(p),
            clock=self.clock,
        )
        self.router.registry.revoke_all()  # type: ignore[union-attr] # tokens of a previous life are void
        # A run no longer in the manager has ended: its requests leave the agents' handoffs (read off the loop: a
        # dict lookup).
        self.live = LiveContext(p, settled=lambda run: run not in self.manager.executors)
        self.live_turns = LiveTurns(
            p, self.live, self.router, self.clock, self.secrets, current=lambda: self.claude.current.values()
        )
        self.router.set_default(self.live_turns.deliver)
        self.claims = ClaimStore(p, clock=self.clock)
        self.locks = LockManager(p)
        self.escalations = EscalationStore(p, clock=self.clock)
        self.outbox = Outbox.for_brain(p)
        self.notify = NotifyService(
            self.outbox,
            self.escalations,
            self.clock,
            self.secrets,
            env,
            p.state,
            lambda esc_id, index, nonce, user: self.escalator.answer_press(esc_id, index, nonce, user),
            self._spawn,
            self.stop,
        )
        self.escalator = StoreEscalator(
            self.escalations,
            self.outbox,
            self.clock,
            self.notify.wake,
            buttons=s.telegram.answers,
            results=s.notify.results,
        )
        self.escalator.learner = Learner(p, self.clock, self.escalations)
        self.troubles = Troubles(p, self.clock, inform=self._tell_trouble, retry=lambda: self.engine.wake())
        self.digest = Digest(  # enabled by _apply_settings
            p, self.outbox, self.clock, s.notify.digest_hours, enabled=False, wake_outbox=self.notify.wake
        )
        self.escalator.on_answered = lambda path: self.engine.wake([path])
        self.notify.on_channel_up = self.escalator.catch_up
        self.assisted = AssistedRunner(self.claims, self.clock)
        spawner = Spawner() if spawner_available() else None
        commands = [cfg for cfg in self.ref.brain.runners.values() if cfg.kind == "command"]
        if spawner is not None and commands:
            spawner.start()  # not at the first agent: its interpreter's start-up would be spent inside a run
        agent_user = default_agent_user(os.geteuid(), s.agent_user)  # ambient runs as root: its agents never do
        if any(run_as(cfg, agent_user) == AGENT_USER for cfg in commands):
            self._agent_user()
        if any(getattr(cfg, "confine", False) for cfg in commands) and (spawner is None or landlock_abi() <= 0):
            log.warning(
                "agents_unconfined",
                reason="no Landlock on this kernel" if spawner is not None else "no spawner on this system",
                hint="agents can do whatever ambient's user can: run them as another user (README)",
            )
        for name in MODEL_KEYS:  # a model's key is masked wherever an agent's words could quote it
            value = credential(name, env)
            if value:
                self.secrets.add(value)
        self._warn_missing_keys(brain, env)
        # Every model call of an AI agent goes through the gateway: metered, budgeted, the real key kept here.
        self.gateway = ModelGateway()
        self.claude = ClaudeRunner(p, environ=env, watch=self.live_turns.watch, gateway=self.gateway)
        self.runners = Runners(
            command=CommandRunner(
                on_spawn=lambda req, pid, started: self.manager.record_spawn(
                    req.run_id, req.item, req.attempt, pid, started
                ),
                spawner=spawner,
                agent_user=agent_user,
            ),
            assisted=self.assisted,
            claude=self.claude,
            # its SDKs are imported when an agent runs
            llm=LlmRunner(environ=env, watch=self.live_turns.watch, gateway=self.gateway),
        )
        self.delegate = AgentDelegate(
            self.ref, self.router, self.runners, self.locks, self.clock, self.live, secrets=self.secrets
        )
        self._dispatchers: list[Dispatcher] = []  # cluster: (set by _apply_settings), closed at the stop
        self._cluster_tasks: set[asyncio.Task[None]] = set()
        self.claims_view = ClaimsWriter(self.claims, self.clock)
        self.emitter = RouterEmitter(self.router, self.clock, sender=s.default_sender)
        self.breaker = Breaker(p, threshold=s.breaker_threshold)
        self.spend = SpendMeter(lambda: self.ref.brain.settings.budget.limits())  # budgets: today's spend, all runs
        self.manager = RunManager(p, self._executor, self.clock)
        self.gateway.hooks = RunMetering(self.manager)
        self.manager.on_finished.append(self._run_finished)
        self.manager.on_park.append(lambda: self.engine.wake())
        self.workflows_eval = WorkflowEvaluator(self)
        self.starts = RunStarts(p, self.ref, self.manager, self.clock, self._progress, self.workflows_eval.mark_started)
        self.packets = PacketDesk(
            p, self.ref, self.router, self.manager, self.starts, self.escalator, self.clock, self.live_turns.deliver
        )
        self.stale_claims = StaleClaimsEvaluator(self.claims, s.stale_claim_hours, self.clock)
        self.query = QueryKeeper(p)  # the query store (status, the console): refreshed after each tick, off the loop
        self.engine = TriggerEngine(
            [
                self.workflows_eval,
                # Before the answers: an ABORT waiting when the daemon starts (`ambient gate abort` while it was
                # down) ends its run before an answer given earlier could start an agent of it.
                InboxEvaluator(p, self.router, self.packets.on_packet),
                EscalationEvaluator(
                    self.escalations,
                    self.manager,
                    self.escalator,
                    self.clock,
                    wake=lambda: self.engine.wake(),
                    respawn=self.starts.respawn,
                ),
                self.stale_claims,
                HeapTrimEvaluator(),
                statemodes.StateModesEvaluator(p, self.clock),
                self.digest,
                self.query,
                IdleEvaluator(self, until_idle=self.options.until_idle),
            ],
            tick_seconds=s.tick_seconds,
            clock=self.clock,
        )

    async def _gateway_if_needed(self) -> None:
        """The model gateway, started once the brain has an AI agent (``kind: claude`` or ``llm``): a brain of
        command agents keeps the socket and the HTTP client (descriptors a tight ``ulimit -n`` counts)."""
        if any(getattr(cfg, "kind", None) in ("claude", "llm") for cfg in self.ref.brain.runners.values()):
            await self.gateway.start()

    def _agent_user(self) -> None:
        """The user a root daemon runs its agents as, made if missing (said in the log either way)."""
        problem = ensure_agent_user()
        if problem is None:
            log.info("agents_run_as", user=AGENT_USER)
        else:
            log.error("agent_user_missing", user=AGENT_USER, problem=problem, hint="docs/agents-and-runners.md")

    def _forget_secrets(self, brain: Brain) -> None:
        """The variables holding secrets by what the settings read (a runner's ``api_key_env``...) leave the
        environment block, and ``os.environ`` when the process is ours; ``options.environ`` keeps them."""
        names = envblock.secret_names(brain.runners, self.options.environ)
        if self.options.forget_secrets:
            envblock.forget(names)
        else:
            envblock.scrub(names)

    def _warn_missing_keys(self, brain: Brain, env: Mapping[str, str]) -> None:
        """At start, not at the first agent: AI agents whose model key this daemon does not have (names only)."""
        missing: dict[str, list[str]] = {}
        for agent, cfg in sorted(brain.runners.items()):
            if cfg.kind == "claude" and not any(credential(n, env) for n in CLAUDE_KEYS):
                missing.setdefault(" or ".join(CLAUDE_KEYS), []).append(agent)
            elif cfg.kind == "llm" and (var := key_name(cfg)) is not None and credential(var, env) is None:
                missing.setdefault(var, []).append(agent)
        for var, agents in missing.items():
            log.warning("model_key_missing", key=var, agents=agents[:10], count=len(agents), hint="ambient doctor")

    def _report(self, brain: Brain) -> None:
        for p in brain.problems:
            text = str(p)
            if text in self._problems_seen:
                continue
            self._problems_seen.add(text)
            (log.warning if p.severity == "warning" else log.error)("brain_problem", problem=text)

    def _executor(self, state: RunState, journal: Journal) -> RunExecutor:
        spec = parse_workflow(state.spec)
        brain = self.ref.brain
        ports = Ports(
            delegate=self.delegate,
            escalator=self.escalator,
            claims=self.claims_view,
            emitter=self.emitter,
            render_text=render,
            render_path=lambda t, v: render_path(t, v, brain.matrix.zone_rules).path,
            clock=self.clock,
            health=self.troubles,
            budget=self.spend,
        )
        template = item_template(spec)
        if isinstance(spec, ForEachWorkflow):
            return ForEachExecutor(state, fanout(spec), template, ports, journal, self.paths)
        assert isinstance(spec, ChainWorkflow)
        plan = FanOut(concurrency=1, retry=retry_policy(spec.retry))  # the chain's workflow-level retry
        defaults = brain.settings.default_agents
        settings = ChainSettings(
            steps=chain_steps(spec, defaults),
            supervisor=spec.supervisor,
            mode=state.mode or spec.mode,
            branch=spec.branch,
            pilote=spec.pilote,
            default_agents={t: spec.agent_for_type(t, defaults) for t in SATELLITE_TYPES},
            threshold=brain.settings.breaker_threshold,
            breaker=self.breaker,
            branches=GitBranches(self.paths.root) if spec.branch else None,
            start_workflow=self.starts.by_trigger,
        )
        return ChainExecutor(state, plan, template, ports, journal, self.paths, settings)

    # -- the daemon's own troubles

    async def _tell_trouble(self, title: str, body: str) -> None:
        """A trouble of the daemon's, to the person now: through the outbox like any message, or, when the outbox
        is on the full disk too, straight to the notifiers (one try: the log and ``status`` say it anyway)."""
        try:
            await self.escalator.inform(title, body, urgent=True)
            return
        except OSError as exc:
            if resource_of(exc) is None:
                raise
        notifier = self.notify.notifier
        if notifier is not None:
            try:
                await notifier.send(Message(title=title[:200], body=body[:3500], kind="info"))
            except Exception as exc:  # noqa: BLE001 - best effort: the log line and status carry the same words
                log.warning("daemon_trouble_not_notified", error=str(exc))

    def _short(self, kind: str) -> None:
        """A shortage seen: descriptors held only to be quick (the lock manager's spare inodes) are given back."""
        if kind == "descriptors":
            shed = self.locks.shed()
            if shed:
                log.info("descriptors_given_back", spare_lock_inodes=shed)

    def _recovered(self, kind: str) -> None:
        """A shortage is over: what it kept from disk (views, not history) is written now."""
        self._instance.write_if_unwritten()
        self.claims_view.retry_unwritten()

    # -- runs

    async def _run_finished(self, state: RunState) -> None:
        self._progress(
            f"run finished: {state.workflow} → {state.outcome} "
            f"({state.success_count}/{len(state.items)} done, {state.escalation_count} escalation(s))"
        )
        await self.escalator.run_finished(state)
        self.engine.wake()

    # -- lifecycle

    def _progress(self, line: str) -> None:
        if self.options.progress is not None:
            self.options.progress(line)

    async def reload(self, *, only_workflows: bool = False) -> None:
        """Reload everything but running runs (they keep their pinned spec); ``only_workflows`` when
        nothing but ``workflows/`` changed (agents, routing and settings stay as loaded)."""
        sighup = self.reload_requested
        self.reload_requested = False
        if sighup:
            systemd.reloading()
            only_workflows = False
        if only_workflows:
            new = await asyncio.to_thread(reload_workflows, self.ref.brain)
        else:
            new = await asyncio.to_thread(load_brain, self.paths, self.options.environ, self.ref.brain)
        self._report(new)
        self._forget_secrets(new)
        if not new.settings_ok:
            log.error("config_invalid_kept_previous", file=self.paths.rel(self.paths.config))
        old = self.ref.brain.settings
        self.ref.brain = new
        self.router.update(new.matrix.matrix, new.matrix.zone_rules)
        changed = settings_changes(old, new.settings)
        changed += await self._apply_settings(new.settings)  # the secrets whose content changed, by name
        if self.started:
            await self._gateway_if_needed()  # an AI agent added: its calls need the gateway before it runs
        if sighup:  # READY=1 before the log line: whoever waits for "reloaded" finds systemd told already
            systemd.ready(self._status_line())
        # Every reload is logged (not only SIGHUP's), so a reload storm from rapid saves is visible.
        log.info(
            "reloaded",
            trigger="sighup" if sighup else "files",
            workflows=len(new.workflows),
            problems=len(new.problems),
            tick_seconds=new.settings.tick_seconds,
            settings_changed=changed,
        )

    def _apply_cluster(self, s: Settings) -> None:
        """``cluster:``: the dispatched agents' SPAWNs go to the workers (docs/cluster.md). A changed server, creds or
        lease makes a new dispatcher; an attempt waiting on the old one keeps it until its result comes."""
        c = s.cluster
        if c is None:
            self.delegate.remote = None
            return
        creds = str(self.paths.root / c.creds) if c.creds is not None else None
        cur = self.delegate.remote
        if cur is not None and (cur.urls, cur.creds, cur.lease_s) == (list(c.urls), creds, c.lease_s):
            cur.dispatch = dict(c.dispatch)
            cur.unreachable_after_s = c.unreachable_after_s
            return
        new = Dispatcher(list(c.urls), creds, c.dispatch, c.lease_s, c.unreachable_after_s)
        self.delegate.remote = new
        self._dispatchers.append(new)
        task = asyncio.get_running_loop().create_task(self._connect_cluster(new), name="cluster-connect")
        self._cluster_tasks.add(task)
        task.add_done_callback(self._cluster_tasks.discard)

    async def _connect_cluster(self, d: Dispatcher) -> None:
        """Connect at start (the consumers exist before a worker looks for them); a failure is said, and each
        dispatched attempt tries again."""
        try:
            await d.link()
            log.info("cluster_connected", urls=d.urls, agents=sorted(a for a in d.dispatch if d.dispatches(a)))
        except Exception as exc:  # noqa: BLE001 - said; the attempts retry the connection
            log.warning("cluster_unreachable", urls=d.urls, error=str(exc))

    async def _apply_settings(self, s: Settings) -> list[str]:
        """Every setting of ``profil/ambient.yml`` takes effect now, at start and at each reload: no restart.

        What is read where it is used needs nothing here (``lock_ttl_min``, ``shutdown_grace_s``, ``runners``,
        ``default_agents``: each attempt or stop reads the current brain); the rest is handed to its owner.
        Secrets are read again too (the bot token, model keys: compared by hash); returns the names of those
        that changed, never their values.
        """
        self.engine.tick_seconds = s.tick_seconds  # read by the engine itself (a changed value was ignored: R-08)
        self.manager.slots.resize(s.concurrency)
        self.gateway.limit(s.model_calls)
        if short := limits_short(s.concurrency):  # agents would fail to start (EMFILE, EAGAIN) short of the cap
            log.warning("limits_below_concurrency", concurrency=s.concurrency, **short)
        self.stale_claims.hours = s.stale_claim_hours
        self.breaker.threshold = s.breaker_threshold
        for ex in self.manager.executors.values():
            if isinstance(ex, ChainExecutor):
                ex.chain.threshold = s.breaker_threshold
        self.emitter.sender = s.default_sender
        self._apply_cluster(s)
        self.runners.command.agent_user = default_agent_user(os.geteuid(), s.agent_user)
        if self.options.log_level is None or self.options.log_format is None:
            fmt = self.options.log_format or s.log_format
            configure_logging(
                (self.options.log_level or s.log_level).upper(), json=None if fmt == "auto" else fmt == "json"
            )
        changed = await self.notify.configure(s)
        self.escalator.buttons = s.telegram.answers
        self.escalator.results = s.notify.results
        if self.escalator.learner is not None:
            self.escalator.learner.bound = s.learning.auto_repeats
            self.escalator.learner.backoff_s = s.learning.backoff_s
        self.claude.pattern_after = s.learning.pattern_after
        self.escalator.notifying = self.notify.active
        self.digest.hours = s.notify.digest_hours
        self.digest.enabled = s.notify.digest and self.notify.active
        self.escalator.digest = self.digest if self.digest.enabled else None
        values = {n: credential(n, self.options.environ) for n in MODEL_KEYS}
        for value in values.values():  # a key changed in $CREDENTIALS_DIRECTORY is masked like the first one
            if value:
                with contextlib.suppress(ValueError):  # too short to mask safely: no real key is
                    self.secrets.add(value)
        key_digests = digests(values)
        if self._key_digests is not None:
            changed += secrets_changed(self._key_digests, key_digests)
        self._key_digests = key_digests
        keys = sorted(key_digests)
        await asyncio.to_thread(self._instance.record_loaded, self.ref.brain, self.clock.now(), keys)
        return changed

    def _status_line(self) -> str:
        runs = self.manager.active_runs()
        waiting = sum(len(r.escalations) for r in runs)
        return f"{len(runs)} run(s) active, {waiting} escalation(s) waiting"

    def _on_files(self, changed: Iterable[Path]) -> None:
        changed = list(changed)
        if any(p.parent == self.paths.claims for p in changed):
            self.assisted.poke()
        self.engine.wake(changed)

    # -- the daemon's run: startup, main loop, shutdown

    async def serve(self) -> int:
        """Run until SIGTERM/SIGINT (or idle with ``until_idle``); return the exit code.

        Three phases, as uvicorn's ``Server.serve``: :meth:`startup` up to ``READY=1``, :meth:`main_loop` until the
        stop, :meth:`shutdown`. Whatever happened, the signal handlers go and the single-instance lock is dropped.
        """
        try:
            await self.startup()
            await self.main_loop()
            await self.shutdown()
            # Non-zero after a task failure so that systemd's Restart=on-failure restarts us (it exited 0, e2e test).
            return 1 if self._failed_task else 0
        finally:
            if self._trap is not None:
                self._trap.close(keep_ignoring=self.options.exits_after)
            self._instance.release()

    async def startup(self) -> None:
        """Everything up to ``READY=1``: the brain taken (:meth:`_take_brain`), the daemon built on it and its
        signals trapped, its unfinished runs resumed (:meth:`_resume`), its tasks started (:meth:`_start_tasks`);
        then systemd and the log are told it is ready."""
        self._take_brain()
        self._build()
        self._forget_secrets(self.ref.brain)
        self.troubles.on_recovered = self._recovered
        self.troubles.on_short = self._short
        self.troubles.start()
        stop, hup = self._on_stop_signal, self._on_hup
        self._trap = SignalTrap(
            asyncio.get_running_loop(), {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: hup}
        )
        self._trap.install()
        resumed = await self._resume()
        await self._gateway_if_needed()  # after the spend is read back from the journals, before any agent starts
        self.query.start()
        frozen = freeze_startup_heap()
        await self._start_tasks()
        self.started = True
        self.engine.wake()
        systemd.ready(self._status_line())
        log.info("daemon_ready", brain=str(self.paths.root), resumed=resumed, pid=os.getpid(), frozen_objects=frozen)

    def _take_brain(self) -> None:
        """Refuse an untrusted filesystem or state folder, take the single-instance lock, sweep crash leftovers (temp
        files only)."""
        check_local_filesystem(self.paths.root)
        raise_descriptor_limit()
        envblock.undumpable()  # /proc/<pid>/environ, mem, maps: closed to an agent of the daemon's own user
        envblock.scrub()  # secrets by name out of /proc/<pid>/environ; by what the settings read: _forget_secrets
        for d in (self.paths.claims, self.paths.locks, self.paths.workflows):
            d.mkdir(parents=True, exist_ok=True)
        check_state(self.paths)  # .ambient/: real folders, 0700, no link anywhere; else exit 2 naming it
        statemodes.keep(self.paths, self.clock.now())  # and every entry closed to others again (then on the tick)
        self._instance.acquire(self.clock.now())
        for d in (
            self.paths.claims,
            self.paths.locks,
            self.paths.state,
            self.paths.inbox,
            self.paths.escalations,
            self.paths.run_journals,
            self.paths.channels,
        ):
            sweep_stale_tmp(d)  # only what a gone writer left: a CLI may be writing here now

    async def _resume(self) -> int:
        """The reconciliation pass: the settings applied, dead locks removed, today's spend counted, every unfinished
        run resumed from its journal (not started yet: the engine starts them). Returns how many were resumed."""
        await self._apply_settings(self.ref.brain.settings)  # before any run resumes or starts
        # Locks of holders that are provably gone (a dead pid on this host), expired, or malformed past their
        # grace: the reconciliation walks them too. A lock whose item will run again is taken anew; one whose
        # release a crash or a power cut lost (R-03: the unlink after the last fsync) would stay otherwise.
        cleaned = await asyncio.to_thread(self.locks.cleanup)
        if cleaned:
            log.info(
                "locks_cleaned",
                count=len(cleaned),
                files=[c.file for c in cleaned[:20]],
                states=sorted({c.state for c in cleaned}),
            )
        await asyncio.to_thread(self.spend.seed_records, self.paths.runs_log, self.clock.now())
        stored = await asyncio.to_thread(stored_questions, self.escalations)
        resumed = self.manager.resume_all(stored)
        for esc_id, why in self.manager.leftovers:  # questions no run waits on: closed, saying why
            with contextlib.suppress(AmbientError, OSError):
                await asyncio.to_thread(self.escalations.cancel, esc_id, why)
                log.warning("escalation_cancelled", escalation=esc_id, reason=why)
        for state in self.manager.active_runs():  # resumed, not started yet: what they spent today
            self.spend.seed_state(state, self.clock.now())
        if resumed:
            self._progress(f"resumed {len(resumed)} unfinished run(s) from disk")
        return len(resumed)

    async def _start_tasks(self) -> None:
        """The daemon's tasks: the engine's tick, the live threads' writer, the watcher (waited for: ``READY=1``
        promises it), the send socket, the watchdog."""
        self._spawn(self.engine.run(self.stop), "engine")
        self._spawn(self.live_turns.run(self.stop), "live")
        if self.options.watch:
            watching = asyncio.Event()
            claims_dir = str(self.paths.claims) + "/"

            def own_claim(path: str) -> bool:
                return path.startswith(claims_dir) and self.claims.is_own_write(path)

            self._spawn(watch_brain(self.paths, self._on_files, self.stop, ready=watching, ignore=own_claim), "watch")
            # READY=1 promises running watchers (RELIABILITY §2.4): without this wait a workflow dropped
            # just after READY was missed until the next timed tick (30 s by default). A watcher that
            # fails to start sets ``stop`` (see _task_done), which ends the wait too.
            await _first_of(watching, self.stop)
        self._send_server = await sendsocket.serve(self.paths.state, self.packets.route_sent, log)
        if self._send_server is not None and self.router.registry is not None:
            # Agents' `ambient send` reach this router now, which knows their tokens: no token files from here
            # on (ChannelRegistry). Those written for agents started before stay until they are revoked.
            self.router.registry.files = False
        # R-09 wants the gap between pings under WATCHDOG_USEC/2; pinging exactly every WATCHDOG_USEC/2 put half
        # the gaps just over it (loop jitter, measured by the e2e test): ping twice as often as that. Nothing
        # is awaited from here to READY=1: a first WATCHDOG=1 must not come before it (e2e test).
        half = systemd.watchdog_interval()
        self._spawn(systemd.watchdog_task(self.stop, interval=half / 2 if half else None), "watchdog")

    async def main_loop(self) -> None:
        """Wait for the stop: SIGTERM/SIGINT, ``--until-idle`` once nothing moves without the person, or a daemon
        task that died. The work runs meanwhile in the tasks :meth:`startup` started (the engine's tick reloads on
        SIGHUP and on changed files, starts and resumes runs; the outbox sends; the watchdog pings)."""
        await self.stop.wait()

    def _spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[object]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("daemon_task_failed", task=task.get_name(), error=repr(exc))
            self._failed_task = task.get_name()
            self.stop.set()  # a dead engine or watcher must not leave a zombie daemon: let systemd restart us

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        log.info("stop_requested", signal=sig.name)
        systemd.stopping("stopping: draining agents")
        self.stop.set()

    def _on_hup(self, sig: signal.Signals = signal.SIGHUP) -> None:
        self.reload_requested = True
        self.engine.wake()

    async def shutdown(self) -> None:
        """The staged shutdown: ``STOPPING=1``, running agents drained for ``shutdown_grace_s`` then their process
        groups killed and recorded as interrupted; notifications and the send socket closed; the claims, the live
        threads and the audit written out; the locks released; ``daemon-events.jsonl`` says it stopped.

        Once the agents are gone the rest takes at most ``STOP_BOUND_S`` (service/stopping.py), whatever the
        backlog or a full disk: what was not written by then is written again from the journals at the next start.
        """
        systemd.stopping("stopping")
        grace = self.ref.brain.settings.shutdown_grace_s
        kill_grace = max((getattr(cfg, "kill_grace_s", 0.0) for cfg in self.ref.brain.runners.values()), default=0.0)
        systemd.extend_timeout(int((grace + kill_grace + STOP_BOUND_S) * 1_000_000))  # drain, SIGTERM → SIGKILL
        await self.manager.shutdown(grace)
        await self.runners.terminate_all(grace)
        # No agent runs any more: from here on the stop is bounded. The guard stays armed until the process ends
        # (the interpreter's exit joins writer threads too).
        StopGuard(GUARD_AT_S, lambda: 1 if self._failed_task else 0).arm()
        deadline = time.monotonic() + WRITE_OUT_S
        await self.notify.close()
        # Only now: the agents drained above still send through the socket, where their tokens are known (they
        # have no token files, see ChannelRegistry). From here `ambient send` routes by itself again.
        await sendsocket.close(self._send_server, self.paths.state)
        if self.router.registry is not None:
            self.router.registry.files = True
        self.runners.close()
        await self.gateway.close()
        for d in self._dispatchers:  # the remote attempts go on; the next start finds their results
            await d.close()
        # Coalesced item claims (interrupted items included) reach the disk, as many as the time allows.
        await self.claims_view.aclose(time_left(deadline, time.monotonic()))
        for t in self._tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.live_turns.flush()
        self.live_turns.close()
        # Every agent is gone and its locks released: close the lock manager, which also removes its pooled
        # ``.spare.tmp.*`` files (a clean stop left them in locks/ until the next start's sweep; e2e test).
        with contextlib.suppress(OSError):
            self.locks.close()
        self.router.close()
        # A refresh under way is joined off the loop, until the writes' time is up (a second at least): the store
        # is a cache its readers refresh before they read.
        await asyncio.to_thread(self.query.close, time_left(deadline, time.monotonic(), floor=1.0))
        try:
            append_line(
                self.paths.state / "daemon-events.jsonl",
                {"ev": "stopped", "at": self.clock.now().isoformat(), "pid": os.getpid()},
                durable=True,
            )
        except OSError as exc:  # a full disk: the stop is not recorded, and nothing else is lost with it
            log.warning("stop_unrecorded", error=str(exc))
        log.info("daemon_stopped")


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waiters = {asyncio.ensure_future(e.wait()) for e in events}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


async def serve(root: Path, options: DaemonOptions | None = None) -> int:
    """Run a daemon on ``root`` until it stops; its exit code."""
    return await Daemon(root, options).serve()
