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
from functools import partial
from pathlib import Path
from typing import Any

from ambient.claims.breakers import Breaker
from ambient.claims.locks import LockManager
from ambient.claims.store import ClaimStore
from ambient.cluster.dispatch import Dispatcher
from ambient.cluster.keeper import RosterKeeper
from ambient.cluster.keeper import forget as forget_roster
from ambient.cluster.protocol import dispatch_map
from ambient.config.brain import Brain, keep_last_good, load_brain, reload_workflows
from ambient.config.settings import Settings, settings_changes
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import AmbientError, NamespaceTakenError
from ambient.core.health import resource_of
from ambient.core.lazylog import get_logger
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
from ambient.engine.tick import TriggerEngine, Wakeup
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
from ambient.runners.confinement import (
    AGENT_USER,
    TEMP_DIRS,
    default_agent_user,
    ensure_agent_user,
    landlock_abi,
    run_as,
)
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
    IdleParts,
    InboxEvaluator,
    SeenWorkflows,
    StaleClaimsEvaluator,
    WorkflowEvaluator,
    WorkflowParts,
)
from ambient.service.heap import HeapTrimEvaluator, freeze_startup_heap
from ambient.service.instance import SingleInstance
from ambient.service.limits import limits_short, raise_descriptor_limit
from ambient.service.live_turns import LiveTurns
from ambient.service.logsetup import configure_logging
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
from ambient.storage.paths import WORKERS_FILE, BrainPaths
from ambient.workflows.fields import SATELLITE_TYPES
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow, parse_workflow
from ambient.workflows.templating import render, render_path

log = get_logger(__name__)


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


@dataclass(frozen=True)
class Wiring:
    """The daemon's parts, as :meth:`Daemon._build` made them: each was built after what it uses, and none is
    replaced afterwards (a reload hands the new brain and settings to them)."""

    ref: BrainRef
    wakeup: Wakeup
    router: Router
    live: LiveContext
    live_turns: LiveTurns
    claims: ClaimStore
    locks: LockManager
    escalations: EscalationStore
    outbox: Outbox
    escalator: StoreEscalator
    notify: NotifyService
    claims_view: ClaimsWriter
    troubles: Troubles
    digest: Digest
    assisted: AssistedRunner
    gateway: ModelGateway
    claude: ClaudeRunner
    runners: Runners
    delegate: AgentDelegate
    emitter: RouterEmitter
    breaker: Breaker
    spend: SpendMeter
    manager: RunManager
    starts: RunStarts
    packets: PacketDesk
    workflows_eval: WorkflowEvaluator
    stale_claims: StaleClaimsEvaluator
    query: QueryKeeper
    engine: TriggerEngine


class Daemon:
    """One ambient daemon on one brain."""

    parts: Wiring  # built at the start (startup)

    def __init__(self, root: Path, options: DaemonOptions | None = None, clock: Clock | None = None) -> None:
        self.paths = BrainPaths(root.absolute())
        self.options = options or DaemonOptions()
        self.clock = clock or SystemClock()
        self.stop = asyncio.Event()
        self.ready = asyncio.Event()  # set once the daemon is up (READY=1): --until-idle waits for it
        self.secrets = SecretRegistry()
        self._instance = SingleInstance(self.paths)
        self._tasks: list[asyncio.Task[object]] = []
        self._problems_seen: set[str] = set()
        self._failed_task: str | None = None  # a daemon task that died: the exit code says so
        self._send_server: asyncio.AbstractServer | None = None
        self._trap: SignalTrap | None = None
        self._key_digests: dict[str, str] | None = None  # the model keys' hashes at the last load (reload compares)
        self._dispatchers: list[Dispatcher] = []  # cluster: (set by _apply_settings), closed at the stop
        self._cluster_tasks: set[asyncio.Task[None]] = set()
        self._roster: asyncio.Task[None] | None = None  # keeps .ambient/workers.json (cluster.keeper)
        self._roster_keeper: RosterKeeper | None = None

    @property
    def started(self) -> bool:
        """Whether the daemon is up (its runs resumed, its tasks started)."""
        return self.ready.is_set()

    # -- wiring

    def _build(self) -> Wiring:
        """The daemon's parts, each built after what it uses and handed it (no part reaches back through the
        daemon). The engine's wake-up comes first: whoever wakes the engine is given it, and the engine, built last
        from its evaluators, reads it. Two cycles remain, each closed by a bound method of the daemon and said where
        it is: the run manager's executors, and the reload."""
        p = self.paths
        env = self.options.environ
        clock = self.clock
        brain = load_brain(p, env)
        self._report(brain)
        self._settings_used(brain)
        ref = BrainRef(brain)
        s = brain.settings
        wakeup = Wakeup()
        outbox_wake = asyncio.Event()  # set after a message is queued: the outbox sends it at once
        # The one true cycle: the executors of runs are built from the parts below (the delegate, the escalator...),
        # and some of those parts report to the manager (the command runner's spawns, the gateway's metering, the
        # live context asking which runs still run). So the manager is built first, with the daemon's bound
        # ``_executor``, which reads the finished wiring when a run starts (never during this build).
        manager = RunManager(p, self._executor, clock)
        router = Router(
            brain.matrix.matrix,
            zone_rules=brain.matrix.zone_rules,
            audit=Journal(p.audit),
            brain_root=p.root,
            registry=ChannelRegistry(p),
            clock=clock,
        )
        router.registry.revoke_all()  # type: ignore[union-attr] # tokens of a previous life are void
        # A run no longer in the manager has ended: its requests leave the agents' handoffs.
        live = LiveContext(p, settled=manager.not_running)
        agents_now: dict[str, dict[str, Any]] = {}  # what each AI agent does now: the Claude runner's, written out
        live_turns = LiveTurns(p, live, router, clock, self.secrets, current=agents_now.values)
        router.set_default(live_turns.deliver)
        claims = ClaimStore(p, clock=clock)
        locks = LockManager(p)
        escalations = EscalationStore(p, clock=clock)
        outbox = Outbox.for_brain(p)
        escalator = StoreEscalator(
            escalations,
            outbox,
            clock,
            outbox_wake,
            buttons=s.telegram.answers,
            results=s.notify.results,
            learner=Learner(p, clock, escalations),
            on_answered=wakeup.file_changed,
        )
        notify = NotifyService(
            outbox,
            escalations,
            clock,
            self.secrets,
            env,
            p.state,
            escalator.answer_press,
            self._spawn,
            self.stop,
            wake=outbox_wake,
            on_channel_up=escalator.catch_up,
        )
        claims_view = ClaimsWriter(claims, clock)
        troubles = Troubles(
            p,
            clock,
            inform=partial(_tell_trouble, escalator, notify),
            retry=wakeup.wake,
            on_recovered=partial(_recovered, self._instance, claims_view),
            on_short=partial(_short, locks),
        )
        digest = Digest(  # enabled by _apply_settings
            p, outbox, clock, s.notify.digest_hours, enabled=False, wake_outbox=outbox_wake
        )
        assisted = AssistedRunner(claims, clock)
        spawner = Spawner() if spawner_available() else None
        commands = [cfg for cfg in brain.runners.values() if cfg.kind == "command"]
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
        gateway = ModelGateway(RunMetering(manager))
        claude = ClaudeRunner(p, environ=env, watch=live_turns.watch, gateway=gateway, current=agents_now)
        runners = Runners(
            command=CommandRunner(on_spawn=manager.spawned, spawner=spawner, agent_user=agent_user),
            assisted=assisted,
            claude=claude,
            # its SDKs are imported when an agent runs
            llm=LlmRunner(environ=env, watch=live_turns.watch, gateway=gateway),
        )
        delegate = AgentDelegate(ref, router, runners, locks, clock, live, secrets=self.secrets)
        emitter = RouterEmitter(router, clock, sender=s.default_sender)
        breaker = Breaker(p, threshold=s.breaker_threshold)
        spend = SpendMeter(ref.budget_limits)  # budgets: today's spend, all runs
        manager.on_finished.append(partial(_run_finished, self._progress, escalator, wakeup.wake))
        manager.on_park.append(wakeup.wake)
        seen = SeenWorkflows(p.state / "workflows.json")
        starts = RunStarts(p, ref, manager, clock, self._progress, seen.mark_started)
        packets = PacketDesk(p, ref, router, manager, starts, escalator, clock, live_turns.deliver)
        # The reload is the daemon's bound method, a cycle by nature: it hands the new brain to every part built here,
        # this evaluator and the engine among them.
        workflows_eval = WorkflowEvaluator(
            WorkflowParts(p, ref, manager, starts, troubles, seen, wake=wakeup.wake, reload=self.reload)
        )
        stale_claims = StaleClaimsEvaluator(claims, s.stale_claim_hours, clock, _stale_every(s.tick_seconds))
        query = QueryKeeper(p)  # the query store (status, the console): refreshed after each tick, off the loop
        idle = IdleParts(
            p, manager, troubles, notify, outbox, clock, wake=wakeup.wake, ready=self.ready, stop=self.stop
        )
        engine = TriggerEngine(
            [
                workflows_eval,
                # Before the answers: an ABORT waiting when the daemon starts (`ambient gate abort` while it was
                # down) ends its run before an answer given earlier could start an agent of it.
                InboxEvaluator(p, router, packets.on_packet),
                EscalationEvaluator(escalations, manager, escalator, clock, wake=wakeup.wake, respawn=starts.respawn),
                stale_claims,
                HeapTrimEvaluator(),
                statemodes.StateModesEvaluator(p, clock),
                digest,
                query,
                IdleEvaluator(idle, until_idle=self.options.until_idle),
            ],
            tick_seconds=s.tick_seconds,
            clock=clock,
            wakeup=wakeup,
        )
        return Wiring(
            ref=ref,
            wakeup=wakeup,
            router=router,
            live=live,
            live_turns=live_turns,
            claims=claims,
            locks=locks,
            escalations=escalations,
            outbox=outbox,
            escalator=escalator,
            notify=notify,
            claims_view=claims_view,
            troubles=troubles,
            digest=digest,
            assisted=assisted,
            gateway=gateway,
            claude=claude,
            runners=runners,
            delegate=delegate,
            emitter=emitter,
            breaker=breaker,
            spend=spend,
            manager=manager,
            starts=starts,
            packets=packets,
            workflows_eval=workflows_eval,
            stale_claims=stale_claims,
            query=query,
            engine=engine,
        )

    async def _gateway_if_needed(self) -> None:
        """The model gateway, started once the brain has an AI agent (``kind: claude`` or ``llm``): a brain of
        command agents keeps the socket and the HTTP client (descriptors a tight ``ulimit -n`` counts)."""
        if any(getattr(cfg, "kind", None) in ("claude", "llm") for cfg in self.parts.ref.brain.runners.values()):
            await self.parts.gateway.start()

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

    def _settings_used(self, brain: Brain) -> None:
        """Say which settings run when ``profil/ambient.yml`` did not load (choose_settings picked them); when it
        did, keep its bytes as the last good settings, which a file that stops parsing falls back to."""
        paths = self.paths
        chosen = brain.chosen
        if chosen is None:
            return
        if chosen.origin == "file" and chosen.source is not None:
            try:
                keep_last_good(paths, chosen.source)
            except OSError as exc:  # a full disk: the daemon runs on, the previous copy stays
                log.warning("settings_last_good_not_kept", path=paths.rel(paths.last_good_config), error=str(exc))
            return
        problem = next((str(e) for e in brain.errors if e.file == paths.rel(paths.config)), None)
        if chosen.last_good is not None:
            log.error(
                "config_invalid_last_good_used",
                file=paths.rel(paths.config),
                problem=problem,
                last_good=chosen.last_good.source,
                saved_at=chosen.last_good.saved_at.isoformat(timespec="seconds"),
                fix="fix the file: the daemon applies it when it changes",
            )
        elif chosen.origin == "previous":
            log.error("config_invalid_kept_previous", file=paths.rel(paths.config), problem=problem)
        elif chosen.origin == "salvaged":  # no previous version to keep: every valid key of the file, the rest defaults
            log.error("config_invalid_valid_keys_used", file=paths.rel(paths.config), problem=problem)
        else:  # nothing of the file parses and it never loaded: the defaults (and the environment)
            log.error("config_invalid_valid_keys_used", file=paths.rel(paths.config), problem=problem, defaults=True)

    def _report(self, brain: Brain) -> None:
        for p in brain.problems:
            text = str(p)
            if text in self._problems_seen:
                continue
            self._problems_seen.add(text)
            (log.warning if p.severity == "warning" else log.error)("brain_problem", problem=text)

    def _executor(self, state: RunState, journal: Journal) -> RunExecutor:
        """The run manager's factory: a run's executor, built from the wiring (which exists by then: runs are
        resumed and started only once :meth:`_build` returned)."""
        spec = parse_workflow(state.spec)
        brain = self.parts.ref.brain
        ports = Ports(
            delegate=self.parts.delegate,
            escalator=self.parts.escalator,
            claims=self.parts.claims_view,
            emitter=self.parts.emitter,
            render_text=render,
            render_path=lambda t, v: render_path(t, v, brain.matrix.zone_rules).path,
            clock=self.clock,
            health=self.parts.troubles,
            budget=self.parts.spend,
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
            breaker=self.parts.breaker,
            branches=GitBranches(self.paths.root) if spec.branch else None,
            start_workflow=self.parts.starts.by_trigger,
        )
        return ChainExecutor(state, plan, template, ports, journal, self.paths, settings)

    # -- lifecycle

    def _progress(self, line: str) -> None:
        if self.options.progress is not None:
            self.options.progress(line)

    async def reload(self, *, only_workflows: bool = False, sighup: bool = False) -> None:
        """Reload everything but running runs (they keep their pinned spec); ``only_workflows`` when
        nothing but ``workflows/`` changed (agents, routing and settings stay as loaded); ``sighup``: asked for by
        SIGHUP (systemd is told, and everything is read again)."""
        if sighup:
            systemd.reloading()
            only_workflows = False
        if only_workflows:
            new = await asyncio.to_thread(reload_workflows, self.parts.ref.brain)
        else:
            new = await asyncio.to_thread(load_brain, self.paths, self.options.environ, self.parts.ref.brain)
        self._report(new)
        self._forget_secrets(new)
        if not only_workflows:
            await asyncio.to_thread(self._settings_used, new)
        old = self.parts.ref.brain.settings
        self.parts.ref.brain = new
        self.parts.router.update(new.matrix.matrix, new.matrix.zone_rules)
        changed = settings_changes(old, new.settings)
        if "web" in changed:  # the hosted console starts and stops with the daemon (docs/configuration.md)
            log.warning("setting_needs_restart", setting="web", fix="systemctl restart ambient")
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
            self.parts.delegate.remote = None
            self._keep_roster(None, 0.0)
            return
        creds = str(self.paths.root / c.creds) if c.creds is not None else None
        dispatch = dispatch_map(
            c.dispatch, self.parts.ref.brain.runners
        )  # cluster.dispatch and each runner's dispatch:
        cur = self.parts.delegate.remote
        same = (cur.urls, cur.creds, cur.lease_s, cur.names) if cur is not None else None
        if cur is not None and same == (list(c.urls), creds, c.lease_s, c.names()):
            cur.dispatch = dispatch
            cur.unreachable_after_s = c.unreachable_after_s
            if self._roster_keeper is not None:
                self._roster_keeper.lost_after_s = c.lost_after_s
            return
        new = Dispatcher(
            list(c.urls), creds, dispatch, c.lease_s, c.unreachable_after_s, c.names(), brain=str(self.paths.root)
        )
        self.parts.delegate.remote = new
        self._dispatchers.append(new)
        task = asyncio.get_running_loop().create_task(self._connect_cluster(new), name="cluster-connect")
        self._cluster_tasks.add(task)
        task.add_done_callback(self._cluster_tasks.discard)
        self._keep_roster(new, c.lost_after_s)

    def _keep_roster(self, d: Dispatcher | None, lost_after_s: float) -> None:
        """The workers file of the current dispatcher (``ambient status`` reads it); none without ``cluster:``."""
        if self._roster is not None:
            self._roster.cancel()
            self._roster = self._roster_keeper = None
        path = self.paths.state / WORKERS_FILE
        if d is None:
            forget_roster(path)
            return
        self._roster_keeper = RosterKeeper(path, d, lost_after_s)
        self._roster = asyncio.get_running_loop().create_task(self._roster_keeper.run(), name="cluster-roster")

    async def _connect_cluster(self, d: Dispatcher) -> None:
        """Connect at start (the consumers exist before a worker looks for them); a failure is said, and each
        dispatched attempt tries again."""
        try:
            await d.link()
            log.info(
                "cluster_connected",
                urls=d.urls,
                namespace=d.names.namespace,
                agents=sorted(a for a in d.dispatch if d.dispatches(a)),
            )
        except NamespaceTakenError as exc:  # said as an error: nothing is dispatched until it is free
            log.error("cluster_namespace_taken", namespace=d.names.namespace, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - said; the attempts retry the connection
            log.warning("cluster_unreachable", urls=d.urls, error=str(exc))

    async def _apply_settings(self, s: Settings) -> list[str]:
        """Every setting of ``profil/ambient.yml`` takes effect now, at start and at each reload: no restart.

        What is read where it is used needs nothing here (``lock_ttl_min``, ``shutdown_grace_s``, ``runners``,
        ``default_agents``: each attempt or stop reads the current brain); the rest is handed to its owner.
        Secrets are read again too (the bot token, model keys: compared by hash); returns the names of those
        that changed, never their values.
        """
        self.parts.engine.tick_seconds = s.tick_seconds  # read by the engine itself (a changed value was ignored: R-08)
        self.parts.manager.slots.resize(s.concurrency)
        self.parts.gateway.limit(s.model_calls)
        if short := limits_short(s.concurrency):  # agents would fail to start (EMFILE, EAGAIN) short of the cap
            log.warning("limits_below_concurrency", concurrency=s.concurrency, **short)
        self.parts.stale_claims.hours = s.stale_claim_hours
        self.parts.stale_claims.every_s = _stale_every(s.tick_seconds)
        self.parts.breaker.threshold = s.breaker_threshold
        for ex in self.parts.manager.executors.values():
            if isinstance(ex, ChainExecutor):
                ex.chain.threshold = s.breaker_threshold
        self.parts.emitter.sender = s.default_sender
        self._apply_cluster(s)
        self.parts.runners.command.agent_user = default_agent_user(os.geteuid(), s.agent_user)
        if self.options.log_level is None or self.options.log_format is None:
            fmt = self.options.log_format or s.log_format
            configure_logging(
                (self.options.log_level or s.log_level).upper(), json=None if fmt == "auto" else fmt == "json"
            )
        changed = await self.parts.notify.configure(s)
        self.parts.escalator.buttons = s.telegram.answers
        self.parts.escalator.results = s.notify.results
        if self.parts.escalator.learner is not None:
            self.parts.escalator.learner.bound = s.learning.auto_repeats
            self.parts.escalator.learner.backoff_s = s.learning.backoff_s
        self.parts.claude.pattern_after = s.learning.pattern_after
        self.parts.escalator.notifying = self.parts.notify.active
        self.parts.digest.hours = s.notify.digest_hours
        self.parts.digest.enabled = s.notify.digest and self.parts.notify.active
        self.parts.escalator.digest = self.parts.digest if self.parts.digest.enabled else None
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
        await asyncio.to_thread(self._instance.record_loaded, self.parts.ref.brain, self.clock.now(), keys)
        return changed

    def _status_line(self) -> str:
        runs = self.parts.manager.active_runs()
        waiting = sum(len(r.escalations) for r in runs)
        return f"{len(runs)} run(s) active, {waiting} escalation(s) waiting"

    def _on_files(self, changed: Iterable[Path]) -> None:
        changed = list(changed)
        if any(p.parent == self.paths.claims for p in changed):
            self.parts.assisted.poke()
        self.parts.engine.wake(changed)

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
        self.parts = self._build()
        self._forget_secrets(self.parts.ref.brain)
        self.parts.troubles.start()
        stop, hup = self._on_stop_signal, self._on_hup
        self._trap = SignalTrap(
            asyncio.get_running_loop(), {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: hup}
        )
        self._trap.install()
        resumed = await self._resume()
        await self._gateway_if_needed()  # after the spend is read back from the journals, before any agent starts
        self.parts.query.start()
        frozen = freeze_startup_heap()
        await self._start_tasks()
        self.ready.set()
        self.parts.engine.wake()
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
        TEMP_DIRS.sweep_left_behind()  # agents' temp dirs a killed daemon made ahead, behind

    async def _resume(self) -> int:
        """The reconciliation pass: the settings applied, dead locks removed, today's spend counted, every unfinished
        run resumed from its journal (not started yet: the engine starts them). Returns how many were resumed."""
        await self._apply_settings(self.parts.ref.brain.settings)  # before any run resumes or starts
        # Locks of holders that are provably gone (a dead pid on this host), expired, or malformed past their
        # grace: the reconciliation walks them too. A lock whose item will run again is taken anew; one whose
        # release a crash or a power cut lost (R-03: the unlink after the last fsync) would stay otherwise.
        cleaned = await asyncio.to_thread(self.parts.locks.cleanup)
        if cleaned:
            log.info(
                "locks_cleaned",
                count=len(cleaned),
                files=[c.file for c in cleaned[:20]],
                states=sorted({c.state for c in cleaned}),
            )
        await asyncio.to_thread(self.parts.spend.seed_records, self.paths.runs_log, self.clock.now())
        stored = await asyncio.to_thread(stored_questions, self.parts.escalations)
        resumed = self.parts.manager.resume_all(stored)
        for esc_id, why in self.parts.manager.leftovers:  # questions no run waits on: closed, saying why
            with contextlib.suppress(AmbientError, OSError):
                await asyncio.to_thread(self.parts.escalations.cancel, esc_id, why)
                log.warning("escalation_cancelled", escalation=esc_id, reason=why)
        for state in self.parts.manager.active_runs():  # resumed, not started yet: what they spent today
            self.parts.spend.seed_state(state, self.clock.now())
        if resumed:
            self._progress(f"resumed {len(resumed)} unfinished run(s) from disk")
        return len(resumed)

    async def _start_tasks(self) -> None:
        """The daemon's tasks: the engine's tick, the live threads' writer, the watcher (waited for: ``READY=1``
        promises it), the send socket, the watchdog."""
        self._spawn(self.parts.engine.run(self.stop), "engine")
        self._spawn(self.parts.live_turns.run(self.stop), "live")
        if self.options.watch:
            watching = asyncio.Event()
            claims_dir = str(self.paths.claims) + "/"

            def own_claim(path: str) -> bool:
                return path.startswith(claims_dir) and self.parts.claims.is_own_write(path)

            self._spawn(watch_brain(self.paths, self._on_files, self.stop, ready=watching, ignore=own_claim), "watch")
            # READY=1 promises running watchers (RELIABILITY §2.4): without this wait a workflow dropped
            # just after READY was missed until the next timed tick (30 s by default). A watcher that
            # fails to start sets ``stop`` (see _task_done), which ends the wait too.
            await _first_of(watching, self.stop)
        self._send_server = await sendsocket.serve(self.paths.state, self.parts.packets.route_sent, log)
        if self._send_server is not None and self.parts.router.registry is not None:
            # Agents' `ambient send` reach this router now, which knows their tokens: no token files from here
            # on (ChannelRegistry). Those written for agents started before stay until they are revoked.
            self.parts.router.registry.files = False
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
        self.parts.workflows_eval.request_reload()
        self.parts.engine.wake()

    async def shutdown(self) -> None:
        """The staged shutdown: ``STOPPING=1``, running agents drained for ``shutdown_grace_s`` then their process
        groups killed and recorded as interrupted; notifications and the send socket closed; the claims, the live
        threads and the audit written out; the locks released; ``daemon-events.jsonl`` says it stopped.

        Once the agents are gone the rest takes at most ``STOP_BOUND_S`` (service/stopping.py), whatever the
        backlog or a full disk: what was not written by then is written again from the journals at the next start.
        """
        systemd.stopping("stopping")
        grace = self.parts.ref.brain.settings.shutdown_grace_s
        kill_grace = max(
            (getattr(cfg, "kill_grace_s", 0.0) for cfg in self.parts.ref.brain.runners.values()), default=0.0
        )
        systemd.extend_timeout(int((grace + kill_grace + STOP_BOUND_S) * 1_000_000))  # drain, SIGTERM → SIGKILL
        await self.parts.manager.shutdown(grace)
        await self.parts.runners.terminate_all(grace)
        # No agent runs any more: from here on the stop is bounded. The guard stays armed until the process ends
        # (the interpreter's exit joins writer threads too).
        StopGuard(GUARD_AT_S, lambda: 1 if self._failed_task else 0).arm()
        deadline = time.monotonic() + WRITE_OUT_S
        await self.parts.notify.close()
        # Only now: the agents drained above still send through the socket, where their tokens are known (they
        # have no token files, see ChannelRegistry). From here `ambient send` routes by itself again.
        await sendsocket.close(self._send_server, self.paths.state)
        if self.parts.router.registry is not None:
            self.parts.router.registry.files = True
        self.parts.runners.close()
        await self.parts.gateway.close()
        if self._roster is not None:  # the workers file stays as last heard: status says the daemon is down
            self._roster.cancel()
            await asyncio.gather(self._roster, return_exceptions=True)
        for d in self._dispatchers:  # the remote attempts go on; the next start finds their results
            await d.close()
        # Coalesced item claims (interrupted items included) reach the disk, as many as the time allows.
        await self.parts.claims_view.aclose(time_left(deadline, time.monotonic()))
        for t in self._tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.parts.live_turns.flush()
        self.parts.live_turns.close()
        # Every agent is gone and its locks released: close the lock manager, which also removes its pooled
        # ``.spare.tmp.*`` files (a clean stop left them in locks/ until the next start's sweep; e2e test).
        with contextlib.suppress(OSError):
            self.parts.locks.close()
        self.parts.router.close()
        # A refresh under way is joined off the loop, until the writes' time is up (a second at least): the store
        # is a cache its readers refresh before they read.
        await asyncio.to_thread(self.parts.query.close, time_left(deadline, time.monotonic(), floor=1.0))
        try:
            append_line(
                self.paths.state / "daemon-events.jsonl",
                {"ev": "stopped", "at": self.clock.now().isoformat(), "pid": os.getpid()},
                durable=True,
            )
        except OSError as exc:  # a full disk: the stop is not recorded, and nothing else is lost with it
            log.warning("stop_unrecorded", error=str(exc))
        log.info("daemon_stopped")


# -- the parts' hooks, as functions of what they use


async def _tell_trouble(escalator: StoreEscalator, notify: NotifyService, title: str, body: str) -> None:
    """A trouble of the daemon's, to the person now: through the outbox like any message, or, when the outbox
    is on the full disk too, straight to the notifiers (one try: the log and ``status`` say it anyway)."""
    try:
        await escalator.inform(title, body, urgent=True)
        return
    except OSError as exc:
        if resource_of(exc) is None:
            raise
    notifier = notify.notifier
    if notifier is not None:
        try:
            await notifier.send(Message(title=title[:200], body=body[:3500], kind="info"))
        except Exception as exc:  # noqa: BLE001 - best effort: the log line and status carry the same words
            log.warning("daemon_trouble_not_notified", error=str(exc))


def _short(locks: LockManager, kind: str) -> None:
    """A shortage seen: descriptors held only to be quick (the lock manager's spare inodes) are given back."""
    if kind == "descriptors":
        shed = locks.shed()
        if shed:
            log.info("descriptors_given_back", spare_lock_inodes=shed)


def _recovered(instance: SingleInstance, claims_view: ClaimsWriter, kind: str) -> None:
    """A shortage is over: what it kept from disk (views, not history) is written now."""
    instance.write_if_unwritten()
    claims_view.retry_unwritten()


def _stale_every(tick_seconds: float) -> float:
    """The least time between two looks at the claims' TTLs: no longer than the regular tick."""
    return min(StaleClaimsEvaluator.EVERY_S, tick_seconds)


async def _run_finished(
    progress: Callable[[str], None], escalator: StoreEscalator, wake: Callable[[], None], state: RunState
) -> None:
    """A run ended: said on the terminal, its escalations closed, and the engine looks again (a schedule may be due,
    ``--until-idle`` may be done)."""
    progress(
        f"run finished: {state.workflow} → {state.outcome} "
        f"({state.success_count}/{len(state.counted())} done, {state.escalation_count} escalation(s))"
    )
    await escalator.run_finished(state)
    wake()


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
