"""Doctor's checks of what agents need to run: the programs of command runners, the Claude Code CLI and the
models' keys of AI agents, and whether this kernel confines agents (Landlock)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._doctor.findings import Finding

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths

# Each check imports what it reads inside its function (the start-up time of the CLI): building the whole parser
# (``ambient --help``, a mistyped command) imports every command module, and doctor's checks with it.


def check_programs(paths: BrainPaths, brain: Any) -> list[Finding]:
    """Command runners whose program (or ``{{python}}`` script) is not there
    (:func:`~ambient.config.brain.program_problems`, the check ``ambient validate`` reports too), with how to fix
    each."""
    from ambient.config.brain import program_problems

    found = []
    for p in program_problems(paths, brain.matrix, brain.runners):
        if p.severity == "warning":
            hint = "install it, or give its full path (the daemon's PATH under systemd may differ)"
        else:
            hint = "fix ambient.runner.argv (paths are relative to the brain, or to runner cwd), or install the program"
        found.append(Finding(p.severity, "runners", p.message, hint, p.file, p.line))
    return found


def check_ai_runners(
    runners: Mapping[str, Any], environ: Mapping[str, str], *, daemon_keys: set[str] | None = None
) -> list[Finding]:
    """AI agents: the Claude Code CLI is there, and the model's key is present (named, never shown): in the running
    daemon's environment when one is up (``daemon_keys``, what it recorded), else in this one or
    ``$CREDENTIALS_DIRECTORY``, which is what ``ambient run`` from here would get. A missing SDK is said by the brain
    check (``extra_problems``)."""

    def has(name: str) -> bool:
        return name in daemon_keys if daemon_keys is not None else credential(name, environ) is not None

    where = "the running daemon's environment" if daemon_keys is not None else "this environment"
    from ambient.runners import claude
    from ambient.runners.extras import missing_extra
    from ambient.runners.keys import credential, key_name

    found: list[Finding] = []
    by_kind: dict[str, list[str]] = {}
    for name, cfg in sorted(runners.items()):
        if getattr(cfg, "kind", None) in ("claude", "llm") and missing_extra(cfg) is None:
            by_kind.setdefault(cfg.kind if cfg.kind == "claude" else f"llm:{cfg.provider}", []).append(name)
    if "claude" in by_kind:
        agents = _agents(by_kind["claude"])
        cli = claude.bundled_cli()
        if cli is None:
            found.append(
                Finding("error", "ai", f"no Claude Code CLI for {agents}", "reinstall: pip install 'ambient[claude]'")
            )
        else:
            found.append(Finding("info", "ai", f"Claude Code CLI: {cli}", "", None, None))
        keys = [n for n in claude.KEY_NAMES if has(n)]
        if keys:
            found.append(Finding("info", "ai", f"model key for {agents}: {keys[0]} is set in {where}", "", None, None))
        else:
            found.append(
                Finding(
                    "error",
                    "ai",
                    f"no model key for {agents}: none of {', '.join(claude.KEY_NAMES)} is set in {where}",
                    "export ANTHROPIC_API_KEY in the daemon's environment, or put it in the file "
                    "$CREDENTIALS_DIRECTORY/anthropic_api_key (systemd: LoadCredential=anthropic_api_key:/etc/...)",
                )
            )
    for kind, names in sorted(by_kind.items()):
        if not kind.startswith("llm:"):
            continue
        needed = sorted({v for n in names if (v := key_name(runners[n])) is not None})
        for var in needed:
            users = _agents([n for n in names if key_name(runners[n]) == var])
            if has(var):
                found.append(Finding("info", "ai", f"model key for {users}: {var} is set in {where}", "", None, None))
            else:
                hint = f"export {var}, or put it in $CREDENTIALS_DIRECTORY/{var.lower()}"
                found.append(Finding("error", "ai", f"no model key for {users}: {var} is not set in {where}", hint))
    return found


def _agents(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"agent{'s' if len(names) > 1 else ''} {shown}"


def check_confinement() -> list[Finding]:
    """Whether agents run confined on this machine (Landlock), and what that means when they do not."""
    from ambient.runners.confinement import landlock_abi
    from ambient.runners.landlock import NET_ABI

    version = landlock_abi()
    if version > 0:
        found = [
            Finding(
                "info",
                "confinement",
                f"agents are confined (Landlock ABI {version}): command and Claude agents (Claude Code and every "
                "command it runs) read the brain but .ambient/ and profil/'s secrets, and write only their scope, "
                "their temp dir and, for Claude, its session folder",
                "an agent with `ambient.runner.confine: false` runs unconfined",
            )
        ]
        if version >= NET_ABI:
            found.append(
                Finding(
                    "info",
                    "confinement",
                    "agents' TCP is confined: they bind no port and connect only to the ports of their runner's "
                    "`network:` (a Claude agent: its model API's too); by port, not host; UDP (DNS) is not covered",
                    "an agent that needs more says so in its runner: `network: [host:port]` or `network: any`",
                )
            )
        else:
            found.append(
                Finding(
                    "warning",
                    "confinement",
                    f"agents' network is not confined: this kernel's Landlock (ABI {version}) has no TCP rules "
                    "(Linux 6.7+); `network:` is not enforced, an agent may listen and connect anywhere",
                    "files are still confined; keep secrets off the network the agents reach",
                )
            )
        return found
    return [
        Finding(
            "warning",
            "confinement",
            "agents run unconfined: this kernel has no Landlock (Linux 5.13+ with landlock in its LSM list); a Claude "
            "agent is then held only by ambient's judgement of each tool call, and an allowed command (pytest, make…) "
            "runs project code that can do whatever your user can",
            "run agents as another user (README, Security); allow no command that runs project code",
        )
    ]


def check_agent_user(
    paths: BrainPaths, configured: str, runners: Mapping[str, Any], euid: int | None = None
) -> list[Finding]:
    """Run as root, ambient runs its command agents that name no ``user:`` as ``configured`` (the ``agent_user``
    setting, ``ambient-agent``): whether that user exists, and whether it can reach the brain (each folder above
    it searchable by others) and the interpreter running ambient. Nothing to check for ``root`` (uid 0, without
    capabilities) or when no agent of ``runners`` runs as that user."""
    import os
    import pwd
    import stat

    from ambient.runners.confinement import AGENT_USER, default_agent_user

    user = default_agent_user(os.geteuid() if euid is None else euid, configured)
    users = [c for c in runners.values() if getattr(c, "kind", None) == "command" and c.user is None]
    if user is None or user == "root" or not users:
        return []
    found: list[Finding] = []
    try:
        pwd.getpwnam(user)
    except KeyError:
        found.append(
            Finding(
                "info",
                "agent user",
                f"agents of this root daemon will run as {user!r}, which does not exist yet",
                "the daemon makes it at start (useradd --system)"
                if user == AGENT_USER
                else "make it, or set agent_user in profil/ambient.yml to one that exists",
            )
        )
    for what, target, folder in unreachable_by_others(paths.root):
        found.append(
            Finding(
                "warning",
                "agent user",
                f"{user!r} cannot reach {what} ({target}): {folder} is {stat.S_IMODE(folder.stat().st_mode):04o}",
                f"its agents fail to start: `chmod o+x {folder}` or `setfacl -m u:{user}:x {folder}`"
                + (", or move the brain" if what == "the brain" else ", or run agents on another program")
                + "; or name a user in the runner (user:); or run agents as root without any capability "
                "(`agent_user: root` in profil/ambient.yml, docs/agents-and-runners.md)",
            )
        )
    return found


def agent_user_warnings(root: Path, configured: str | None, euid: int | None = None) -> list[str]:
    """What ``ambient init`` and ``ambient validate`` say, run as root, when the agent user (``configured``, else
    ``$AMBIENT_AGENT_USER``, else ``ambient-agent``) cannot reach the brain or the interpreter: every agent would
    fail to start (``Permission denied``), and a new user in a container meets it at the README's tour."""
    import os

    from ambient.runners.confinement import AGENT_USER

    if (os.geteuid() if euid is None else euid) != 0:
        return []
    user = configured or os.environ.get("AMBIENT_AGENT_USER") or AGENT_USER
    if user == "root":
        return []
    return [
        f"run as root, ambient runs its agents as {user!r}, which cannot reach {what}: {folder} is not searchable by "
        f"others, so every agent fails to start. Fix it (`chmod o+x {folder}`), or set `agent_user: root` in "
        "profil/ambient.yml (docs/agents-and-runners.md, 'Agents never run as root'); `ambient doctor` checks it again"
        for what, _target, folder in unreachable_by_others(root)
    ]


def unreachable_by_others(root: Path) -> list[tuple[str, Path, Path]]:
    """What another user (the agent user of a root daemon) cannot reach: ``(what, target, the first folder on the
    way not searchable by others)`` for the brain and for the interpreter running ambient."""
    import stat
    import sys

    blocked: list[tuple[str, Path, Path]] = []
    for what, target in (("the brain", root.resolve()), ("ambient's interpreter", Path(sys.executable))):
        for folder in [*reversed(target.resolve().parents)] + ([target] if what == "the brain" else []):
            try:
                mode = folder.stat().st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                blocked.append((what, target, folder))
                break
    return blocked
