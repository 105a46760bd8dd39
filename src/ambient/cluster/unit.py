"""The systemd unit of a worker host (``ambient worker --print-unit``; ``examples/systemd/ambient-worker.service`` is
this text for an example host). Pure: text from the worker's own arguments.

The worker gets the daemon's hardening (its agents run under it, confined as on the daemon's host), its NATS
credentials file by ``LoadCredential=`` (never in argv or the environment), and ``KillMode=mixed``: SIGTERM to the
worker alone, which stops its agents, ends their leases and hands their items to another worker at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: What an argument of ExecStart may hold as given: no space, quote, backslash or systemd specifier (``%``).
_PLAIN = re.compile(r"^[^\s\"'\\%;$`]+$")

#: The folders ``PrivateTmp=yes`` gives the service empty.
_PRIVATE_TMP = ("/tmp", "/var/tmp")  # noqa: S108 - named to be avoided, not used

#: The name of the NATS credentials file in ``$CREDENTIALS_DIRECTORY`` (``%d`` in the unit).
CREDENTIAL = "nats-creds"


def unit_problems(brain: str, user: str, user_exists: bool, closed: Sequence[str]) -> list[str]:
    """What would keep the printed unit from starting on this host as it is now: the unit's user missing, the brain
    under a temporary folder (``PrivateTmp=yes`` gives the service an empty one), ``closed``: folders on the way to
    ambient's interpreter or the brain that the user cannot enter (a venv under ``/root``)."""
    found = []
    if not user_exists:
        found.append(f"no user {user!r} on this host: create it first (useradd --system {user})")
    if any(brain == d or brain.startswith(d + "/") for d in _PRIVATE_TMP):
        found.append(f"the brain {brain} is under a temporary folder the service does not see (PrivateTmp=yes)")
    found += [f"{user} cannot enter {folder}: install ambient or the brain where it can" for folder in closed]
    return found


def worker_unit(
    ambient: str,
    brain: str,
    urls: Sequence[str],
    agents: Sequence[str],
    *,
    slots: int = 1,
    creds: str | None = None,
    user: str = "ambient",
) -> str:
    """The unit that runs ``ambient worker`` with these arguments as a system service (``user``'s). Raises
    ValueError for an argument the unit could not carry as written (a space, a quote, a ``%``)."""
    for value in (ambient, brain, *urls, *agents, *([creds] if creds is not None else []), user):
        if not _PLAIN.match(value):
            raise ValueError(
                f"{value!r} cannot be written in a unit as is (a space, quote or %): write the unit by hand"
            )
    argv = [ambient, "worker", "--brain", brain]
    for url in urls:
        argv += ["--nats", url]
    if creds is not None:
        argv += ["--creds", f"%d/{CREDENTIAL}"]
    argv += ["--agents", ",".join(agents), "--slots", str(slots), "--name", "%H", "--log-format", "json"]
    credential = (
        "# The worker's NATS user (ambient cluster creds): readable by this service only, at\n"
        f"# $CREDENTIALS_DIRECTORY/{CREDENTIAL} (%d), never in argv, Environment= or the agents' environment.\n"
        f"LoadCredential={CREDENTIAL}:{creds}\n"
        if creds is not None
        else "# No NATS user: a server on 127.0.0.1 without authorization (one machine only; docs/cluster.md).\n"
    )
    return f"""\
# ambient worker: runs the dispatched agents of a brain on this host (docs/cluster.md).
# Install: see README.md beside the daemon's unit; print one for your own host with
#   ambient worker --brain DIR --nats URL --creds FILE --agents A,B --slots N --print-unit
# Checked with `systemd-analyze verify` and `systemd-analyze security --offline=true`.
# Before enabling it (docs/cluster.md, "A worker under systemd"):
# - create its user: useradd --system --no-create-home --shell /usr/sbin/nologin {user}
# - install ambient where that user can read it: ExecStart below is the ambient this unit was printed from (a
#   venv under /root or a 0700 home is not: install it in /opt/ambient, say, and print the unit from there)
# - give it a copy of the brain it owns (--brain, WorkingDirectory=), not under /tmp: PrivateTmp=yes gives the
#   service its own empty /tmp

[Unit]
Description=ambient worker: agents of a brain on this host
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
Type=exec
ExecStart={" ".join(argv)}
# This host's copy of the brain (a clone of its repository): the agents run and write there.
WorkingDirectory={brain}
User={user}
Group={user}
Restart=on-failure
RestartSec=5s
# KillMode=mixed: SIGTERM to the worker only; it stops its agents, ends their leases and hands their items to
# another worker at once; whatever remains is SIGKILLed after the timeout (its agents end with it anyway).
KillMode=mixed
TimeoutStopSec=30s
Environment=PYTHONUNBUFFERED=1
{credential}StateDirectory=ambient
StateDirectoryMode=0700

# Hardening, as the daemon's unit: it applies to the agents the worker starts as well.
UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={brain}
PrivateTmp=yes
PrivateDevices=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictRealtime=yes
RestrictNamespaces=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
CapabilityBoundingSet=
TasksMax=4096
LimitNOFILE=1024:65536
MemoryMax=2G

[Install]
WantedBy=multi-user.target
"""
