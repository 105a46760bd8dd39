"""What an agent is given besides its argv: its environment, explicit and minimal (S-06), the SPAWN packet as JSON
text, and its working folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ambient.core.errors import SpawnTemplateError
from ambient.runners.base import RunRequest
from ambient.runners.runner_config import CommandRunnerConfig
from ambient.storage.fsutil import resolve_in_brain

#: Largest SPAWN packet (JSON bytes) handed to an agent on stdin.
MAX_PACKET_BYTES = 1024 * 1024
#: The packet is also put in ``AMBIENT_PACKET`` when its JSON is at most this long (else stdin only).
MAX_ENV_PACKET_BYTES = 32 * 1024
#: Variables taken from the daemon's own environment; nothing else of ``os.environ`` reaches an agent (S-06).
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


def build_env(req: RunRequest, cfg: CommandRunnerConfig, packet_json: str) -> dict[str, str]:
    """The explicit environment of an agent: a few inherited basics, ``cfg.env``, then the AMBIENT_* channel.

    Never NOTIFY_SOCKET, WATCHDOG_*, CREDENTIALS_DIRECTORY or anything else of the daemon's environment (S-06).
    """
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update(cfg.env)  # validated: cannot name AMBIENT_*, NOTIFY_SOCKET, WATCHDOG_*, LISTEN_*, LD_*
    env.update(
        AMBIENT_AGENT=req.agent,
        AMBIENT_RUN_ID=req.run_id,
        AMBIENT_ITEM=req.item,
        AMBIENT_ATTEMPT=str(req.attempt),
        AMBIENT_KEY=req.key,
        AMBIENT_BRAIN=str(req.brain),
        AMBIENT_CHANNEL_TOKEN=req.channel_token,
    )
    if req.worker:
        env["AMBIENT_WORKER"] = req.worker
    if len(packet_json.encode()) <= MAX_ENV_PACKET_BYTES:
        env["AMBIENT_PACKET"] = packet_json
    handoff = req.bounded_handoff()
    if handoff:
        env["AMBIENT_HANDOFF"] = handoff
    for name, value in env.items():
        if "\x00" in value:
            msg = f"environment value {name} contains a NUL byte"
            raise SpawnTemplateError(msg)
    return env


def encode_packet(packet: Any) -> str:
    """The SPAWN packet as compact JSON text; raises SpawnTemplateError when not JSON-ready or too large."""
    try:
        text = json.dumps(packet, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        msg = f"SPAWN packet is not JSON-serialisable: {exc}"
        raise SpawnTemplateError(msg) from None
    if len(text.encode()) > MAX_PACKET_BYTES:
        msg = f"SPAWN packet is over {MAX_PACKET_BYTES} bytes"
        raise SpawnTemplateError(msg)
    return text


def agent_cwd(req: RunRequest, cfg: CommandRunnerConfig) -> Path:
    """Where the agent runs: ``cfg.cwd`` (absolute, or inside the brain), else the brain."""
    if cfg.cwd is None:
        return req.brain
    if cfg.cwd.startswith("/"):
        return Path(cfg.cwd)
    return resolve_in_brain(req.brain, cfg.cwd)
