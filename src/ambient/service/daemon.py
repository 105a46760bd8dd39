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
import fcntl
import gc
import json
import os
import re
import signal
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from ambient import __version__
from ambient.claims.breakers import Breaker
from ambient.claims.locks import LockManager
from ambient.claims.store import ClaimStore
from ambient.config.brain import Brain, load_brain, reload_workflows
from ambient.config.settings import Settings, settings_changes
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import AlreadyRunningError, AmbientError
from ambient.core.health import describe, resource_of
from ambient.core.redact import SecretRegistry, redact_text
from ambient.engine import events
from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.compile import chain_steps, fanout, item_template, items_of
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import ANSWER, FanOut
from ambient.engine.ports import EscalationRequest, Ports
from ambient.engine.runs import RunExecutor, new_run_id
from ambient.engine.runstate import RunState
from ambient.engine.spend import SpendMeter
from ambient.engine.themebranch import GitBranches
from ambient.engine.tick import Tick, TriggerEngine
from ambient.human.escalations import Escalation, EscalationStore
from ambient.human.notify import Message, Outbox
from ambient.kernel import sendsocket
from ambient.kernel.packet import Packet
from ambient.kernel.router import Channel, ChannelRegistry, Router, write_inbox
from ambient.live.context import LiveContext, turn_record
from ambient.runners import CommandRunner, Runners
from ambient.runners.assisted import AssistedRunner
from ambient.runners.base import RunRequest
from ambient.runners.claude import KEY_NAMES as CLAUDE_KEYS
from ambient.runners.claude import MODEL_KEYS, NOW_FILE, ClaudeRunner
from ambient.runners.command import landlock_abi
from ambient.runners.keys import credential
from ambient.runners.spawner import Spawner
from ambient.runners.spawner import available as spawner_available
from ambient.service import envblock, systemd
from ambient.service.adapters import (
    AgentDelegate,
    BrainRef,
    ClaimsWriter,
    Digest,
    EscalationEvaluator,
    InboxEvaluator,
    Learner,
    RouterEmitter,
    StoreEscalator,
)
from ambient.service.heap import HeapTrimEvaluator
from ambient.service.limits import limits_short
from ambient.service.lineage import descends_from
from ambient.service.notifications import NotifyService
from ambient.service.signals import SignalTrap
from ambient.service.troubles import Troubles
from ambient.service.watch import watch_brain
from ambient.service.writer_threads import background_executor
from ambient.storage.fsutil import (
    PRIVATE_FILE,
    TMP_MARK,
    atomic_write,
    check_local_filesystem,
    check_state,
    open_private,
    private_dir,
    sweep_tmp,
)
from ambient.storage.journal import Journal, append_line
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_CLAIM_BYTES
from ambient.workflows.loading import LoadedWorkflow
from ambient.workflows.spec import SATELLITE_TYPES, ChainWorkflow, ForEachWorkflow, parse_workflow
from ambient.workflows.templating import render, render_path

log = structlog.get_logger(__name__)
#: After a write the disk had no room for (or a descriptor shortage), the engine looks again this soon.
_HELD_UP_RETRY_S = 2.0


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


class SingleInstance:
    """``flock`` on ``.ambient/daemon.lock`` for the daemon's lifetime; the kernel drops it if we die."""

    def __init__(self, paths: BrainPaths) -> None:
        self.paths = paths
        self.fd: int | None = None
        self.info: dict[str, Any] = {}
        self.unwritten = False  # daemon.json could not be written (a full disk): written again once there is room

    @property
    def info_path(self) -> Path:
        return self.paths.state / "daemon.json"

    def acquire(self, now: datetime) -> None:
        private_dir(self.paths.state)
        fd = open_private(self.paths.daemon_lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = lock_holder(self.paths.daemon_lock) or running_pid(self.paths, alive=True)
            raise AlreadyRunningError(
                f"ambient is already running on {self.paths.root}"
                + (f" (pid {pid})" if pid else "")
                + "; stop it first (systemctl stop ambient, or kill -TERM the pid)"
            ) from None
        self.fd = fd
        self.info = {"pid": os.getpid(), "started_at": now.isoformat(), "version": __version__}
        self._write_info()

    def record_loaded(self, brain: Brain, now: datetime, model_keys: Iterable[str] = ()) -> None:
        """Say in ``daemon.json`` what the daemon runs with: ``profil/ambient.yml`` (its sha256 and values, secrets
        masked; ``ambient doctor`` compares them with the file to tell a daemon that did not reload) and each
        workflow's sha256 (a file that no longer loads keeps its previous version here, which ``ambient start``
        then starts)."""
        found = brain.settings_file
        self.info["settings"] = {
            "applied_at": now.isoformat(),
            "digest": found.digest if found else None,
            "file": found.own if found else None,
        }
        self.info["workflows"] = {name: wf.spec_hash for name, wf in sorted(brain.workflows.items())}
        self.info["model_keys"] = sorted(model_keys)  # names only: `ambient doctor` checks the daemon's, not its own
        self._write_info()

    def _write_info(self) -> None:
        """``daemon.json``: what the CLI reads of the running daemon. A full disk does not keep the daemon from
        starting (a restart loop under systemd, issue 24, 3): the flock says it runs, the file follows later."""
        try:
            atomic_write(self.info_path, json.dumps(self.info) + "\n", mode=PRIVATE_FILE)
        except OSError as exc:
            if resource_of(exc) is None:
                raise
            self.unwritten = True
            log.warning("daemon_info_not_written", path=str(self.info_path), error=str(exc))
        else:
            self.unwritten = False

    def write_if_unwritten(self) -> None:
        if self.unwritten and self.fd is not None:
            self._write_info()

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def respawn_run_id(esc: Escalation) -> str:
    """The run an answer to an agent's own ESCALATE (sent outside any run) starts: the same for the same answer."""
    return new_run_id(f"spawn-{esc.respawn}", esc.answered_at or esc.created_at, esc.id.removeprefix("esc-"))


def daemon_up(paths: BrainPaths) -> bool:
    """True while a daemon holds the brain (a live flock, not a pid file that can go stale)."""
    if not paths.daemon_lock.exists():
        return False
    fd = os.open(paths.daemon_lock, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def raise_descriptor_limit(want: int = 1 << 16) -> int:
    """Raise the soft limit on open files towards the hard one (to ``want``): a fan-out holds a few descriptors
    per agent, and 1024 (the usual soft default) ran out under load where the hard limit allowed far more
    (issue 24, 4). Returns the soft limit in force; logs when it stays low."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < 256:
        log.warning(
            "descriptor_limit_low",
            limit=soft,
            hint="raise LimitNOFILE= in the systemd unit (or `ulimit -n`): agents need a few descriptors each",
        )
    return int(soft)


def running_pid(paths: BrainPaths, *, alive: bool = False) -> int | None:
    """The pid the running daemon wrote, if readable (and, with ``alive``, only if that process exists)."""
    try:
        data = json.loads((paths.state / "daemon.json").read_text())
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if alive:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass  # another user's process: it exists
    return pid


def lock_holder(path: Path) -> int | None:
    """The pid holding an exclusive ``flock`` on ``path``, from Linux's ``/proc/locks`` (None elsewhere or unknown).

    A daemon that loses the start race names the winner from this: ``daemon.json`` is written only once the lock is
    taken, so in between it still names the previous daemon, possibly long dead (issue 24, 5)."""
    try:
        st = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 26824 fe:00:2146670 0 EOF" (a waiter's line has "->" in second place)
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == ident:
            with contextlib.suppress(ValueError):
                pid = int(parts[4])
                if pid > 0:
                    return pid
    return None


class WorkflowEvaluator:
    """Reloads the brain when its files change, and starts runs: a new workflow file starts one run;
    ``schedule: every`` starts the next when due. Seen workflows are remembered in ``.ambient/workflows.json``."""

    name = "workflows"

    #: Reload debounce (R-08: 50 rapid saves must not cause 50 reloads). A change after this long without
    #: changes reloads at once (a dropped workflow starts promptly); changes closer together than this are
    #: coalesced into one trailing reload once the files have been quiet this long...
    RELOAD_QUIET_S = 0.1
    #: ... or after this long of constant churn, so that a file rewritten forever still gets loaded.
    RELOAD_MAX_WAIT_S = 2.0

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.path = daemon.paths.state / "workflows.json"
        self.seen: dict[str, dict[str, Any]] = self._load()
        self._dirs = (daemon.paths.workflows, daemon.paths.agents, daemon.paths.profil)
        self._fp = self._fingerprint()
        self._last_change = float("-inf")
        self._pending_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _fingerprint(self) -> frozenset[tuple[str, int, int, int]]:
        """A cheap listing (name, mtime, size, inode) of the files a reload reads."""
        out: set[tuple[str, int, int, int]] = set()
        for d in self._dirs:
            with contextlib.suppress(OSError), os.scandir(d) as entries:
                for e in entries:
                    if e.name.startswith(".") or TMP_MARK in e.name:
                        continue
                    with contextlib.suppress(OSError):
                        st = e.stat(follow_symlinks=False)
                        out.add((e.path, st.st_mtime_ns, st.st_size, st.st_ino))
        return frozenset(out)

    async def _reload_due(self, tick: Tick) -> bool:
        """Whether this tick reloads the brain (see RELOAD_QUIET_S); schedules the trailing reload."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if tick.timed:
            # File events are hints (RELIABILITY §2.3): a timed tick compares the listing, which is also how
            # ``--no-watch`` picks up new and edited files (it never reloaded before: e2e test).
            fp = await asyncio.to_thread(self._fingerprint)
            changed, self._fp = fp != self._fp, fp
        else:
            changed = any(tick.touched(p) for p in self._dirs)
            if changed:
                self._fp = await asyncio.to_thread(self._fingerprint)
        if changed:
            isolated = self._pending_since is None and now - self._last_change >= self.RELOAD_QUIET_S
            self._last_change = now
            if isolated:
                return True
            if self._pending_since is None:
                self._pending_since = now
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_later(self.RELOAD_QUIET_S + 0.01, self.d.engine.wake)
            return False
        return self._pending_since is not None and (
            now - self._last_change >= self.RELOAD_QUIET_S or now - self._pending_since >= self.RELOAD_MAX_WAIT_S
        )

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
            return {str(k): dict(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        atomic_write(self.path, json.dumps(self.seen, indent=1, sort_keys=True) + "\n", mode=PRIVATE_FILE)

    async def evaluate(self, tick: Tick) -> None:
        d = self.d
        due = await self._reload_due(tick)
        if d.reload_requested or due:
            self._pending_since = None
            only_wf = not tick.timed and all(
                p.parent == d.paths.workflows for p in tick.changes if any(p.is_relative_to(x) for x in self._dirs)
            )
            await d.reload(only_workflows=only_wf)
            # Changes seen while the reload ran belong to the same burst: coalesce them (not "isolated").
            self._last_change = max(self._last_change, asyncio.get_running_loop().time())
        for name, wf in sorted(d.ref.brain.workflows.items()):
            if not wf.spec.runnable:
                continue
            entry = self.seen.get(name)
            if entry is None:
                # A workflow seen for the first time runs once: dropping a file is how a person asks.
                # Crash order: the run's ``started`` is fsync'd before workflows.json says "seen", so a kill
                # in between cannot lose the run (saving first did: the workflow never ran). A journal already on
                # disk for it means a kill came right after the start: that run is resumed, not started twice.
                # A start the disk had no room for is not "seen": it is tried again once there is room.
                if name not in d.manager.journaled and not d.tried(partial(d.start_run, wf, trigger="file")):
                    continue
                self.seen[name] = {"first_hash": wf.spec_hash, "last_started": tick.now.isoformat(), "runs": 1}
                await d.save_or_wait(self._save)
                continue
            sched = wf.spec.schedule
            if sched is not None and not d.has_active_run(name):
                last = datetime.fromisoformat(str(entry.get("last_started")))
                if tick.now >= last + timedelta(seconds=sched.every):
                    if not d.tried(partial(d.start_run, wf, trigger="schedule")):
                        continue
                    entry["last_started"] = tick.now.isoformat()
                    entry["runs"] = int(entry.get("runs", 0)) + 1
                    await d.save_or_wait(self._save)

    def mark_started(self, name: str, spec_hash: str, now: datetime) -> None:
        entry = self.seen.setdefault(name, {"first_hash": spec_hash, "runs": 0})
        entry["last_started"] = now.isoformat()
        entry["runs"] = int(entry.get("runs", 0)) + 1
        self._save()


class StaleClaimsEvaluator:
    """Open claims past their TTL become ``stale`` (timed ticks only; only changed claim files are read)."""

    name = "stale_claims"
    FULL_SCAN_S = 600.0
    CTIME_SLACK_NS = 2_000_000_000  # ctimes come from a coarse clock; a file written during a look counts as new

    def __init__(self, store: ClaimStore, hours: float, clock: Clock) -> None:
        self.store = store
        self.hours = hours
        self.clock = clock
        # Idle cost (bench/idle.py): parsing 1,000 claims on every timed tick cost ~1 s of CPU per tick. A timed
        # tick stats the files and parses only those that changed; mark_stale runs only when some claim is due.
        # Only open claims are remembered (their file's inode, size and mtime and when they go stale): a file
        # changed since the last look has a newer ctime (any write, rename or link sets it), so closed claims
        # need no memory at all. R-12's soak writes 9 claim files per run: remembering every file grew the
        # daemon ~3 KB a run. Every FULL_SCAN_S, and when the clock went back, every file is looked at again.
        self._open: dict[str, tuple[tuple[int, int, int], datetime]] = {}
        self._last_look_ns = 0  # wall clock at the start of the last look (ctimes are wall clock)
        self._last_full_ns = 0
        self._wall_ns: Callable[[], int] = time.time_ns

    async def evaluate(self, tick: Tick) -> None:
        if not tick.timed:
            return
        now = self.clock.now()
        if not await asyncio.to_thread(self._any_due, now):
            return
        changed = await asyncio.to_thread(self.store.mark_stale, now=now, default_ttl=timedelta(hours=self.hours))
        if changed:
            log.info("claims_stale", count=len(changed))

    def _any_due(self, now: datetime) -> bool:
        """Whether an open claim may be past its TTL; reads only the claim files changed since the last look."""
        tz = now.astimezone().tzinfo
        assert tz is not None
        default = timedelta(hours=self.hours)
        look_ns = self._wall_ns()
        full = look_ns < self._last_look_ns or look_ns - self._last_full_ns > self.FULL_SCAN_S * 1e9
        since = 0 if full else self._last_look_ns - self.CTIME_SLACK_NS
        seen: dict[str, tuple[tuple[int, int, int], datetime]] = {}
        try:
            entries = os.scandir(self.store.dir)
        except FileNotFoundError:
            entries = None
        with entries if entries is not None else contextlib.nullcontext(()) as it:
            due = self._look(it, now, tz, default, since, seen)
        self._open = seen
        self._last_look_ns = look_ns
        if full:
            self._last_full_ns = look_ns
        return due

    def _look(
        self,
        entries: Iterable[os.DirEntry[str]],
        now: datetime,
        tz: tzinfo,
        default: timedelta,
        since: float,
        seen: dict[str, tuple[tuple[int, int, int], datetime]],
    ) -> bool:
        # One entry at a time, not a list of them: claims/ only grows (9 files a run in R-12's soak), and a list
        # of every entry with its stat held ~0.9 KB a file at once each tick (3.7 MB at 4,000 files). Peaks like
        # that, freed again, leave the allocator's arenas a little larger each time.
        from ambient.claims.claim import ClaimFacts

        due = False
        for e in entries:
            if e.name.startswith(".") or not e.name.endswith((".yml", ".yaml")):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            hit = self._open.get(e.name)
            if hit is not None and hit[0] == sig:
                seen[e.name] = hit
                due = due or now > hit[1]
                continue
            if hit is None and st.st_ctime_ns < since:
                continue  # not open when last looked at, and unchanged since
            # A claim ambient wrote itself (every item of a fan-out) is known without parsing it again: parsing
            # 2,000 item claims after a run took ~3 s of CPU (bench/fanout.py, py-spy).
            facts = self.store.known_facts(Path(e.path), sig)
            if facts is None and stat.S_ISREG(st.st_mode) and _not_open(e.path):
                continue  # closed (or another status) by its one top-level status line: no parse needed
            if facts is None:
                try:
                    facts = ClaimFacts.of(self.store.read(Path(e.path))[0])
                except (AmbientError, OSError):
                    continue  # unreadable: mark_stale skips it too (ambient doctor reports it)
            at = facts.stale_at(tz, default)
            if at is not None:
                seen[e.name] = (sig, at)
                due = due or now > at
        return due


#: A top-level ``status:`` line of a block-mapping claim (column 0: a line inside a block or quoted scalar of a
#: top-level key is indented), its value plain or quoted, an end-of-line comment allowed.
_STATUS_LINE = re.compile(rb"""^status[ \t]*:[ \t]+(["']?)([A-Za-z_]+)\1[ \t]*(?:#[^\n]*)?\r?$""", re.MULTILINE)


def _not_open(path: str) -> bool:
    """Whether a claim file surely is not open, from its text: exactly one top-level ``status:`` line, not ``open``.

    The full look every FULL_SCAN_S parsed every claim file the store had not written itself (2-3 ms each with the
    safe loader): a brain keeps every claim, so a long-running daemon spent minutes of CPU on each full look
    (R-12's soak writes 9 claim files a run). Anything unusual (no such line, two of them, flow style, unreadable)
    answers False and the file is parsed as before.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.read(fd, MAX_CLAIM_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    if len(data) > MAX_CLAIM_BYTES:
        return False
    found = _STATUS_LINE.findall(data)
    return len(found) == 1 and found[0][1] != b"open"


class IdleEvaluator:
    """``--until-idle``: stop once no agent runs and every run waits on the person (or is done)."""

    name = "idle"

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    async def evaluate(self, tick: Tick) -> None:
        d = self.d
        if not (d.options.until_idle and d.started and d.manager.idle) or any(d.paths.inbox.glob("*.json")):
            return
        if "disk" in d.troubles.health.conditions:
            return  # work held up by a full disk is not done: it goes on once there is room
        if d.notify.active:
            # Notifications are part of the work: wait for those due soon (a first try, a quick retry).
            soon = d.clock.now() + timedelta(seconds=2)
            entries = await asyncio.to_thread(d.outbox.entries)
            if any(e.next_at <= soon for e in entries):
                asyncio.get_running_loop().call_later(0.2, d.engine.wake)
                return
        log.info("idle", runs=len(d.manager.executors))
        d.stop.set()


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
        self._tasks: list[asyncio.Task[Any]] = []
        self._problems_seen: set[str] = set()
        self._failed_task: str | None = None  # a daemon task that died: the exit code says so
        self._send_server: asyncio.AbstractServer | None = None

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
        self.live = LiveContext(p)
        self._live_queue: list[Packet] = []
        self._runner_turns: list[dict[str, Any]] = []  # AI agents' turns (see _watch)
        self._now_written: list[dict[str, Any]] | None = None
        self._live_writer = background_executor("live")  # turns no agent waits for: see ambient.service.writer_threads
        self.router.set_default(self._deliver)
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
            self._on_press,
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
        self.escalator.learner = Learner(p, self.clock)
        self.troubles = Troubles(p, self.clock, inform=self._tell_trouble)
        self.digest = Digest(  # enabled by _apply_settings
            p, self.outbox, self.clock, s.notify.digest_hours, enabled=False, wake_outbox=self.notify.wake
        )
        self.escalator.on_answered = lambda path: self.engine.wake([path])
        self.assisted = AssistedRunner(self.claims, self.clock)
        spawner = Spawner() if spawner_available() else None
        commands = [cfg for cfg in self.ref.brain.runners.values() if cfg.kind == "command"]
        if spawner is not None and commands:
            spawner.start()  # not at the first agent: its interpreter's start-up would be spent inside a run
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
        self.claude = ClaudeRunner(p, environ=env, watch=self._watch)
        self.runners = Runners(
            command=CommandRunner(
                on_spawn=lambda req, pid, started: self.manager.record_spawn(
                    req.run_id, req.item, req.attempt, pid, started
                ),
                spawner=spawner,
            ),
            assisted=self.assisted,
            claude=self.claude,
            llm=_llm_runner(env, self._watch),
        )
        self.delegate = AgentDelegate(
            self.ref, self.router, self.runners, self.locks, self.clock, self.live, secrets=self.secrets
        )
        self.claims_view = ClaimsWriter(self.claims, self.clock)
        self.emitter = RouterEmitter(self.router, self.clock, sender=s.default_sender)
        self.breaker = Breaker(p, threshold=s.breaker_threshold)
        self.spend = SpendMeter(lambda: self.ref.brain.settings.budget.limits())  # budgets: today's spend, all runs
        self.manager = RunManager(p, self._executor, self.clock)
        self.manager.on_finished.append(self._run_finished)
        self.manager.on_park.append(lambda: self.engine.wake())
        self.workflows_eval = WorkflowEvaluator(self)
        self.stale_claims = StaleClaimsEvaluator(self.claims, s.stale_claim_hours, self.clock)
        self.engine = TriggerEngine(
            [
                self.workflows_eval,
                EscalationEvaluator(
                    self.escalations,
                    self.manager,
                    self.escalator,
                    self.clock,
                    wake=lambda: self.engine.wake(),
                    respawn=self._respawn,
                ),
                InboxEvaluator(p, self.router, self._on_packet),
                self.stale_claims,
                HeapTrimEvaluator(),
                self.digest,
                IdleEvaluator(self),
            ],
            tick_seconds=s.tick_seconds,
            clock=self.clock,
        )

    def _warn_missing_keys(self, brain: Brain, env: Mapping[str, str]) -> None:
        """At start, not at the first agent: AI agents whose model key this daemon does not have (names only)."""
        from ambient.runners.keys import key_name

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
        plan = FanOut(concurrency=1, retry=fanout_retry(spec))
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
            start_workflow=self._start_by_trigger,
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

    def _recovered(self, kind: str) -> None:
        """A shortage is over: what it kept from disk (views, not history) is written now."""
        self._instance.write_if_unwritten()
        self.claims_view.retry_unwritten()

    def held_up(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the daemon ran out of something (a full disk, descriptors): then it is told once
        (log, status, doctor, a notification), the engine looks again shortly, and the caller leaves the work for
        then instead of failing it (issue 24, 3)."""
        kind = resource_of(exc)
        if kind is None:
            return False
        where = getattr(exc, "filename", None)
        place = str(Path(where).parent) if isinstance(where, str) else str(self.paths.state)
        self.troubles.trouble(kind, describe(kind, getattr(exc, "strerror", None) or str(exc), place))
        log.warning("waiting_for_resources", resource=kind, error=str(exc))
        asyncio.get_running_loop().call_later(_HELD_UP_RETRY_S, self.engine.wake)
        return True

    def tried(self, job: Callable[[], object]) -> bool:
        """Run ``job``; False when it could not for want of a resource (:meth:`held_up`), other errors raised."""
        try:
            job()
        except OSError as exc:
            if not self.held_up(exc):
                raise
            return False
        self.troubles.recovered(["disk"])
        return True

    async def save_or_wait(self, save: Callable[[], None]) -> None:
        """A small state file (workflows.json): written, or left for the next save when the disk is full (what it
        records is in memory, and the runs it guards have their journals on disk already)."""
        try:
            await asyncio.to_thread(save)
        except OSError as exc:
            if not self.held_up(exc):
                raise

    # -- runs

    def start_run(
        self,
        wf: LoadedWorkflow,
        *,
        trigger: str,
        context: Mapping[str, Any] | None = None,
        mode: str | None = None,
        at_step: str | None = None,
    ) -> str:
        """Start a run pinned to this version of the workflow (its spec and hash are in the journal)."""
        spec = wf.spec
        items = items_of(spec)
        run_id = self.manager.start(
            workflow=spec.name,
            form=spec.form,
            spec=spec.model_dump(mode="json"),
            spec_hash=wf.spec_hash,
            items=items,
            mode=mode or spec.mode,
            trigger=trigger,
            context=context,
        )
        if at_step is not None and isinstance(spec, ChainWorkflow):
            ex = self.manager.executors[run_id]
            idx = next((i for i, s in enumerate(spec.chain) if s.key == str(at_step)), None)
            if idx is None:
                log.warning("start_step_unknown", workflow=spec.name, step=at_step, run_id=run_id)
            elif idx:
                for earlier in spec.chain[:idx]:  # not run: skipped, so the run's outcome counts only what ran
                    ex.event(events.skipped, item=earlier.key, before_start=True)
                ex.event(events.cursor, index=idx)
        self._progress(
            f"run started: {spec.name} ({len(items)} {'items' if spec.form == 'for_each' else 'steps'}) — {run_id}"
        )
        return run_id

    def _start_by_trigger(self, name: str, step: str | None, context: Mapping[str, Any], trigger: str) -> str | None:
        """A chain's ``trigger:<workflow>/<step>``: a run of that workflow, at that step."""
        wf = self.ref.brain.workflows.get(name)
        if wf is None or not wf.spec.runnable:
            log.warning("trigger_unknown_workflow", workflow=name)
            return None
        self.workflows_eval.mark_started(name, wf.spec_hash, self.clock.now())
        return self.start_run(wf, trigger=trigger, context=context, at_step=step)

    def has_active_run(self, workflow: str) -> bool:
        return any(ex.state.workflow == workflow for ex in self.manager.executors.values())

    async def _run_finished(self, state: RunState) -> None:
        self._progress(
            f"run finished: {state.workflow} → {state.outcome} "
            f"({state.success_count}/{len(state.items)} done, {state.escalation_count} escalation(s))"
        )
        await self.escalator.run_finished(state)
        self.engine.wake()

    async def _on_packet(self, pkt: Packet) -> None:
        """A packet ``ambient send`` delivered (the inbox): a turn of its target's live thread (a HANDOFF or a
        CHECKPOINT rewrites the handoff), then what it asks of ambient (the orchestrator interface of spec/004)."""
        await self._deliver(pkt)
        ctx = pkt.payload.context or {}
        sig = str(pkt.signal)
        if sig == "ORCHESTRATE":
            name = str(ctx.get("workflow"))
            wf = self.ref.brain.workflows.get(name)
            if wf is None:
                log.warning("orchestrate_unknown_workflow", workflow=name)
                return
            extra = ctx.get("context")
            step = ctx.get("step")
            self.workflows_eval.mark_started(name, wf.spec_hash, self.clock.now())
            self.start_run(
                wf,
                trigger=f"orchestrate:{pkt.from_}",
                context=extra if isinstance(extra, dict) else None,
                at_step=str(step) if step is not None else None,
            )
        elif sig == "ABORT":
            name = str(ctx.get("workflow"))
            for ex in list(self.manager.executors.values()):
                if ex.state.workflow == name or ex.state.run_id == name:
                    ex.abort(by=pkt.from_, reason=str(ctx.get("reason", "")))
        elif sig == "ADAPT":
            name = str(ctx.get("workflow"))
            changes = ctx.get("changes") if isinstance(ctx.get("changes"), dict) else {}
            skip = changes.get("skip") if isinstance(changes, dict) else None
            for ex in self.manager.executors.values():
                if ex.state.workflow != name:
                    continue
                for item in ex.state.items:
                    if isinstance(skip, list) and item.name in [str(s) for s in skip] and item.status == "pending":
                        ex.event(events.skipped, item=item.name)
                ex.event(events.note, text=f"ADAPT from {pkt.from_}: {json.dumps(changes)[:300]}")
                ex.journal.sync()
                ex.poke()
        elif sig == "SPAWN" and (pkt.to in self.ref.brain.runners or pkt.to in self.ref.brain.matrix.agents):
            self.start_spawn(pkt)
        elif sig == "ESCALATE" and pkt.from_ not in ("human", "ambient"):
            await self._escalate_sent(pkt)
        else:
            log.info("packet_received", signal=sig, sender=pkt.from_, to=pkt.to)

    def start_spawn(self, pkt: Packet) -> str | None:
        """A SPAWN handed in by ``ambient send`` runs its agent: a one-item run ``spawn-<agent>``, seen in ``status``
        and ``runs`` like any other, its SPAWN sent from the packet's sender (the matrix decides it again), the
        packet's files locked, its ``payload.context`` handed to the agent, its questions escalated to the sender."""
        return self._start_one(
            pkt.to,
            pkt.from_,
            list(pkt.scope.files),
            pkt.scope.zone,
            dict(pkt.payload.context or {}),
            item=pkt.id,
            trigger=f"send:{pkt.from_}",
        )

    def _start_one(
        self,
        agent: str,
        sender: str,
        files: list[str],
        zone: str | None,
        context: dict[str, Any],
        *,
        item: str,
        trigger: str,
        run_id: str | None = None,
    ) -> str | None:
        if any("{{" in f for f in files):
            log.warning("spawn_refused", agent=agent, item=item, reason="a file of the SPAWN contains '{{'")
            return None
        doc = {
            "workflow": f"spawn-{agent}",
            "description": f"a SPAWN of {agent} sent by {sender}",
            "sender": sender,
            "supervisor": sender,
            "for_each": {"items": [item], "spawn": agent, "scope": {"zone": zone, "files": files}},
        }
        try:
            spec = parse_workflow(doc)
        except AmbientError as exc:
            log.warning("spawn_refused", agent=agent, item=item, reason=str(exc))
            return None
        run_id = self.manager.start(
            workflow=spec.name,
            form=spec.form,
            spec=spec.model_dump(mode="json"),
            spec_hash=None,
            items=[item],
            trigger=trigger,
            context=context,
            run_id=run_id,
        )
        self._progress(f"run started: {spec.name} (a SPAWN from {sender}) — {run_id}")
        return run_id

    async def _escalate_sent(self, pkt: Packet) -> None:
        """An agent's ESCALATE handed in by ``ambient send``, outside any run: an escalation like any other (file,
        notification, ``ambient decide``, Telegram); the answer SPAWNs the agent again with it in
        ``payload.context.decision``, as a one-item run."""
        ctx = pkt.payload.context or {}
        question = str(ctx.get("question") or f"{pkt.from_} asks a decision")
        req = EscalationRequest(
            run_id=pkt.session_id or f"send-{pkt.id}",
            workflow=f"spawn-{pkt.from_}",
            item=None,
            agent=pkt.from_,
            kind="question",
            question=question[:2000],
            options=[(o, o, ANSWER) for o in pkt.payload.options],
            dedupe_key=f"send/{pkt.id}",
            respawn=pkt.from_,
        )
        await self.escalator.escalate(req)

    def _respawn(self, esc: Escalation) -> None:
        """The answer to an agent's own ESCALATE (see _escalate_sent): the agent runs again with it."""
        option = esc.decided_option
        answer = option.label if option is not None else str(esc.decision)
        assert esc.respawn is not None
        # One run per answer, whatever restarts come: its id comes from the escalation, and a journal under that id
        # means the answer was acted on already (every start re-reads the answered escalations).
        run_id = respawn_run_id(esc)
        if self.paths.run_journal(run_id).exists():
            return
        self._start_one(
            esc.respawn,
            "human",
            [],
            None,
            {"decision": answer, "question": esc.question, "escalation": esc.id},
            item=esc.id,
            trigger=f"decision:{esc.id}",
            run_id=run_id,
        )

    async def _route_sent(self, raw: bytes, token: str | None, peer: int | None = None) -> dict[str, Any]:
        """A packet ``ambient send`` handed over the send socket: routed as the command would route it itself.

        No token is the person, unless the peer is one of the daemon's agents (its descendant, see
        :mod:`~.lineage`): an agent that unset its token is nobody the router vouches for (issue 25, 1)."""
        registry = self.router.registry
        channel = registry.channel_for(token) if registry is not None else Channel.human()
        if not token and peer is not None and descends_from(peer, os.getpid()) is not False:
            channel = Channel("unauthenticated")
            log.warning("send_without_token_from_an_agent", peer=peer)
        outcome = await self.router.send(raw, channel, deliver=self._to_inbox)
        answer = sendsocket.summary(outcome)
        log.info("packet_sent", via="socket", status=answer["status"], packet=answer["id"], to=answer["to"])
        return answer

    async def _to_inbox(self, pkt: Packet) -> None:
        await asyncio.to_thread(write_inbox, self.paths, pkt)

    async def _deliver(self, pkt: Packet) -> None:
        """Every delivered packet goes to its agent's live thread (batched off the loop)."""
        self._live_queue.append(pkt)

    async def _flush_live(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.25)
            await self._flush_live_once()

    def _write_now(self) -> None:
        """``.ambient/now.json``: the tool each AI agent is using right now (``ambient status`` shows it), written
        when it changes; a view, not durable."""
        current = sorted(self.claude.current.values(), key=lambda c: (c["run_id"], c["item"]))
        if current == self._now_written:
            return
        self._now_written = current
        try:
            atomic_write(self.paths.state / NOW_FILE, json.dumps(current).encode(), mode=0o600, durable=False)
        except OSError as exc:
            log.warning("now_view_failed", error=str(exc))

    def _watch(self, req: RunRequest, kind: str, text: str) -> None:
        """An AI agent's turn (a message, a tool call, its result, a denial) for its live thread, batched like the
        packets' turns; secrets masked before anything is kept."""
        self._runner_turns.append(
            {
                "ts": self.clock.now().isoformat(),
                "target": req.agent,
                "requester": str(req.packet.get("from") or "ambient"),  # the SPAWN's sender: its conversation
                "correlation_id": req.key,
                "role": "agent",
                "source": "runner",
                "signal": kind.upper(),
                "text": redact_text(text, self.secrets),
            }
        )

    async def _flush_live_once(self) -> None:
        self.router.flush()  # the audit log is buffered by the router; push it out with the live threads
        self._write_now()
        batch, self._live_queue = self._live_queue, []
        turns, self._runner_turns = self._runner_turns, []
        if not batch and not turns:
            return

        def write() -> None:
            records: list[dict[str, Any]] = list(turns)
            for pkt in batch:
                try:
                    rec = turn_record(pkt.wire_view(), ts=pkt.ts, correlation_id=pkt.correlation_id)
                except (AmbientError, ValueError) as exc:
                    log.warning("live_context_append_failed", error=str(exc))
                    continue
                if rec is not None:
                    records.append(rec)
            try:
                self.live.append_records(records)
            except (AmbientError, OSError) as exc:
                log.warning("live_context_append_failed", error=str(exc))

        await asyncio.get_running_loop().run_in_executor(self._live_writer, write)

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
        if not new.settings_ok:
            log.error("config_invalid_kept_previous", file=self.paths.rel(self.paths.config))
        old = self.ref.brain.settings
        self.ref.brain = new
        self.router.update(new.matrix.matrix, new.matrix.zone_rules)
        changed = settings_changes(old, new.settings)
        await self._apply_settings(new.settings)
        # Every reload is logged (not only SIGHUP's), so a reload storm from rapid saves is visible.
        log.info(
            "reloaded",
            trigger="sighup" if sighup else "files",
            workflows=len(new.workflows),
            problems=len(new.problems),
            tick_seconds=new.settings.tick_seconds,
            settings_changed=changed,
        )
        if sighup:
            systemd.ready(self._status_line())

    async def _apply_settings(self, s: Settings) -> None:
        """Every setting of ``profil/ambient.yml`` takes effect now, at start and at each reload: no restart.

        What is read where it is used needs nothing here (``lock_ttl_min``, ``shutdown_grace_s``, ``runners``,
        ``default_agents``: each attempt or stop reads the current brain); the rest is handed to its owner.
        """
        self.engine.tick_seconds = s.tick_seconds  # read by the engine itself (a changed value was ignored: R-08)
        self.manager.slots.resize(s.concurrency)
        if short := limits_short(s.concurrency):  # agents would fail to start (EMFILE, EAGAIN) short of the cap
            log.warning("limits_below_concurrency", concurrency=s.concurrency, **short)
        self.stale_claims.hours = s.stale_claim_hours
        self.breaker.threshold = s.breaker_threshold
        for ex in self.manager.executors.values():
            if isinstance(ex, ChainExecutor):
                ex.chain.threshold = s.breaker_threshold
        self.emitter.sender = s.default_sender
        if self.options.log_level is None or self.options.log_format is None:
            from ambient.service.logs import configure_logging

            fmt = self.options.log_format or s.log_format
            configure_logging(
                (self.options.log_level or s.log_level).upper(), json=None if fmt == "auto" else fmt == "json"
            )
        await self.notify.configure(s)
        self.escalator.buttons = s.telegram.answers
        self.escalator.results = s.notify.results
        self.escalator.notifying = self.notify.active
        self.digest.hours = s.notify.digest_hours
        self.digest.enabled = s.notify.digest and self.notify.active
        self.escalator.digest = self.digest if self.digest.enabled else None
        keys = [n for n in MODEL_KEYS if credential(n, self.options.environ)]
        await asyncio.to_thread(self._instance.record_loaded, self.ref.brain, self.clock.now(), keys)

    def _status_line(self) -> str:
        runs = self.manager.active_runs()
        waiting = sum(len(r.escalations) for r in runs)
        return f"{len(runs)} run(s) active, {waiting} escalation(s) waiting"

    def _on_files(self, changed: Any) -> None:
        changed = list(changed)
        if any(p.parent == self.paths.claims for p in changed):
            self.assisted.poke()
        self.engine.wake(changed)

    async def serve(self) -> int:
        """Run until SIGTERM/SIGINT (or idle with ``until_idle``); return the exit code."""
        check_local_filesystem(self.paths.root)
        raise_descriptor_limit()
        envblock.scrub()  # secrets out of /proc/<pid>/environ: the settings keep their copy (issue 25, 2)
        for d in (self.paths.claims, self.paths.locks, self.paths.workflows):
            d.mkdir(parents=True, exist_ok=True)
        check_state(self.paths)  # .ambient/: real folders, 0700, no link anywhere; else exit 2 naming it
        self._instance.acquire(self.clock.now())
        trap: SignalTrap | None = None
        try:
            for d in (
                self.paths.claims,
                self.paths.locks,
                self.paths.state,
                self.paths.inbox,
                self.paths.escalations,
                self.paths.run_journals,
                self.paths.channels,
            ):
                sweep_tmp(d)
            self._build()
            self.troubles.on_recovered = self._recovered
            self.troubles.start()
            stop, hup = self._on_stop_signal, self._on_hup
            trap = SignalTrap(
                asyncio.get_running_loop(), {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: hup}
            )
            trap.install()
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
            resumed = self.manager.resume_all()
            for state in self.manager.active_runs():  # resumed, not started yet: what they spent today
                self.spend.seed_state(state, self.clock.now())
            if resumed:
                self._progress(f"resumed {len(resumed)} unfinished run(s) from disk")
            frozen = _freeze_startup_heap()
            self._spawn(self.engine.run(self.stop), "engine")
            self._spawn(self._flush_live(), "live")
            if self.options.watch:
                watching = asyncio.Event()
                claims_dir = str(self.paths.claims) + "/"

                def own_claim(path: str) -> bool:
                    return path.startswith(claims_dir) and self.claims.is_own_write(path)

                self._spawn(
                    watch_brain(self.paths, self._on_files, self.stop, ready=watching, ignore=own_claim), "watch"
                )
                # READY=1 promises running watchers (RELIABILITY §2.4): without this wait a workflow dropped
                # just after READY was missed until the next timed tick (30 s by default). A watcher that
                # fails to start sets ``stop`` (see _task_done), which ends the wait too.
                await _first_of(watching, self.stop)
            self._send_server = await sendsocket.serve(self.paths.state, self._route_sent, log)
            if self._send_server is not None and self.router.registry is not None:
                # Agents' `ambient send` reach this router now, which knows their tokens: no token files from here
                # on (ChannelRegistry). Those written for agents started before stay until they are revoked.
                self.router.registry.files = False
            # R-09 wants the gap between pings under WATCHDOG_USEC/2; pinging exactly every WATCHDOG_USEC/2 put half
            # the gaps just over it (loop jitter, measured by the e2e test): ping twice as often as that. Nothing
            # is awaited from here to READY=1: a first WATCHDOG=1 must not come before it (e2e test).
            half = systemd.watchdog_interval()
            self._spawn(systemd.watchdog_task(self.stop, interval=half / 2 if half else None), "watchdog")
            self.started = True
            self.engine.wake()
            systemd.ready(self._status_line())
            log.info(
                "daemon_ready", brain=str(self.paths.root), resumed=len(resumed), pid=os.getpid(), frozen_objects=frozen
            )
            await self.stop.wait()
            await self._shutdown()
            # Non-zero after a task failure so that systemd's Restart=on-failure restarts us (it exited 0, e2e test).
            return 1 if self._failed_task else 0
        finally:
            if trap is not None:
                trap.close(keep_ignoring=self.options.exits_after)
            self._instance.release()

    async def _on_press(self, esc_id: str, index: int, nonce: str, user: Any) -> Any:
        """A Telegram button press: the same answer as ``ambient decide``, then the run resumes at once."""
        from ambient.human.escalations import AlreadyAnsweredError
        from ambient.human.telegram import PressResult, decision_text, nonce_matches

        try:
            esc = await asyncio.to_thread(self.escalations.get, esc_id)
        except AmbientError:
            return PressResult("invalid", "Unknown escalation.")
        if not nonce_matches(esc.nonce, nonce):
            return PressResult("invalid", "This button is not valid any more.")
        try:
            done = await asyncio.to_thread(
                self.escalations.answer, esc_id, str(index + 1), by=user.name, channel="telegram"
            )
        except AlreadyAnsweredError as exc:
            prev = exc.escalation
            if prev.status == "cancelled":
                return PressResult("already_decided", f"No longer needed: {prev.note or 'cancelled'}")
            when = prev.answered_at or prev.timed_out_at or self.clock.now()
            line = decision_text(prev.decision or "", prev.by or "?", when)  # as the deciding press showed it
            return PressResult("already_decided", f"Already decided: {prev.decision} by {prev.by}", line)
        self.engine.wake([self.paths.escalations / f"{esc_id}.yml"])
        return PressResult("decided", decision_text(done.decision or "", user, self.clock.now()))

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
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

    async def _shutdown(self) -> None:
        systemd.stopping("stopping")
        grace = self.ref.brain.settings.shutdown_grace_s
        kill_grace = max((getattr(cfg, "kill_grace_s", 0.0) for cfg in self.ref.brain.runners.values()), default=0.0)
        systemd.extend_timeout(int((grace + kill_grace + 10) * 1_000_000))  # drain, then SIGTERM → SIGKILL
        await self.manager.shutdown(grace)
        await self.runners.terminate_all(grace)
        await self.notify.close()
        # Only now: the agents drained above still send through the socket, where their tokens are known (they
        # have no token files, see ChannelRegistry). From here `ambient send` routes by itself again.
        await sendsocket.close(self._send_server, self.paths.state)
        if self.router.registry is not None:
            self.router.registry.files = True
        self.runners.close()
        self.claims_view.close()  # coalesced item claims (interrupted items included) reach the disk
        for t in self._tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._flush_live_once()
        self._live_writer.shutdown(wait=True)
        # Every agent is gone and its locks released: close the lock manager, which also removes its pooled
        # ``.spare.tmp.*`` files (a clean stop left them in locks/ until the next start's sweep; e2e test).
        with contextlib.suppress(OSError):
            self.locks.close()
        self.router.close()
        append_line(
            self.paths.state / "daemon-events.jsonl",
            {"ev": "stopped", "at": self.clock.now().isoformat(), "pid": os.getpid()},
            durable=True,
        )
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


def fanout_retry(spec: ChainWorkflow) -> Any:
    """The chain's workflow-level retry policy in the planner's terms."""
    from ambient.engine.compile import retry_policy

    return retry_policy(spec.retry)


async def serve(root: Path, options: DaemonOptions | None = None) -> int:
    """Run a daemon on ``root`` until it stops; its exit code."""
    return await Daemon(root, options).serve()


def _freeze_startup_heap() -> int:
    """Keep what start-up built (modules, pydantic schemas, the loaded brain) out of every later collection.

    Performance (bench/fanout.py): the cyclic collector's full collections walked that whole heap while a
    fan-out ran, ~0.2 ms per item (three gen-2 passes of ~80 ms in a 2,000-item run, measured with
    ``gc.callbacks``). Frozen objects are still freed by reference counting; only cycles among them would
    stay, and start-up objects live as long as the daemon anyway.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _llm_runner(environ: Mapping[str, str], watch: Callable[[RunRequest, str, str], None]) -> Any:
    """The ``llm`` runner (its SDKs are imported only when an agent runs)."""
    from ambient.runners.llm import LlmRunner

    return LlmRunner(environ=environ, watch=watch)
