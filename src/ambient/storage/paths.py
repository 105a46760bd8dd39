"""Where everything lives in a brain. One place, so no module invents its own layout.

User-owned (people, agents and ambient all write them)::

    agents/*.md          agent frontmatter: IPC gate (brain.ipc) and runner (ambient.runner)
    claims/*.yml         BSI claims (sessions, runs, items, steps)
    locks/*.lock         file-lock mutex
    profil/ambient.yml   ambient's configuration
    profil/routing.yml   instance routing table (narrows the access matrix)
    profil/zones.yml     optional zone rules of this brain
    workflows/*.yml      workflow specs

ambient's own state (``.ambient/``, add it to ``.gitignore``)::

    daemon.lock          held (flock) by the running daemon; names its pid
    audit.jsonl          every packet decision of the router
    runs.jsonl           one summary record per finished run (the learning loop reads it)
    runs/<run>.jsonl     the event history of one run (source of truth for resume)
    inbox/               packets handed in by `ambient send`, consumed by the daemon
    run/send.sock        the running daemon's send socket (ambient.kernel.sendsocket); the folder is 0700
    escalations/*.yml    escalations waiting for (or answered by) the person
    channels/            hashed per-spawn tokens: which agent a channel belongs to
    live/<agent>/        per-agent live context (log.jsonl, handoff.md)
    outbox/              notifications waiting to be delivered

Private: every folder of ``.ambient/`` is a real folder (never a symlink) of mode 0700, every file ambient writes
there 0600; :func:`ambient.storage.fsutil.private_dir` is the one rule that creates or checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATE_DIRNAME = ".ambient"
#: Files at the top of ``.ambient/`` that must be regular files when they exist (checked at daemon start).
STATE_FILES = frozenset(
    {"audit.jsonl", "runs.jsonl", "daemon.lock", "daemon.json", "daemon-events.jsonl", "modes.json"}
)
#: Under the state folder: what each AI agent is doing now (written by the daemon, read by ``ambient status``).
NOW_FILE = "now.json"
#: Under the state folder: the cluster's workers as the daemon last heard them (read by ``status``, ``doctor``, the
#: console; docs/cluster.md).
WORKERS_FILE = "workers.json"


@dataclass(frozen=True)
class BrainPaths:
    """The layout of one brain rooted at ``root``."""

    root: Path
    state_override: Path | None = None

    @property
    def agents(self) -> Path:
        return self.root / "agents"

    @property
    def claims(self) -> Path:
        return self.root / "claims"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def profil(self) -> Path:
        return self.root / "profil"

    @property
    def workflows(self) -> Path:
        return self.root / "workflows"

    @property
    def config(self) -> Path:
        return self.profil / "ambient.yml"

    @property
    def routing(self) -> Path:
        return self.profil / "routing.yml"

    @property
    def zones(self) -> Path:
        return self.profil / "zones.yml"

    @property
    def state(self) -> Path:
        return self.state_override or (self.root / STATE_DIRNAME)

    @property
    def daemon_lock(self) -> Path:
        return self.state / "daemon.lock"

    @property
    def last_good_config(self) -> Path:
        """The last ``profil/ambient.yml`` the daemon loaded, byte for byte: what it runs on while the file does not
        parse (it holds the file's secrets, such as notification URLs: 0600 in the closed state folder)."""
        return self.state / "settings.last-good.yml"

    @property
    def audit(self) -> Path:
        return self.state / "audit.jsonl"

    @property
    def runs_log(self) -> Path:
        return self.state / "runs.jsonl"

    @property
    def run_journals(self) -> Path:
        return self.state / "runs"

    def run_journal(self, run_id: str) -> Path:
        return self.run_journals / f"{run_id}.jsonl"

    @property
    def inbox(self) -> Path:
        return self.state / "inbox"

    @property
    def escalations(self) -> Path:
        return self.state / "escalations"

    @property
    def channels(self) -> Path:
        return self.state / "channels"

    @property
    def live(self) -> Path:
        return self.state / "live"

    @property
    def state_dirs(self) -> tuple[Path, ...]:
        """Every fixed folder of ``.ambient/`` (``live/<agent>/`` are made as threads start), the state first."""
        s = self.state
        return (s, self.run_journals, self.inbox, self.escalations, self.channels, self.live, s / "outbox", s / "run")

    def rel(self, path: Path) -> str:
        """``path`` relative to the brain root, for messages."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)
