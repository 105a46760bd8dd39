"""What an agent is given besides its argv (runners/agent_env.py), without starting one: the explicit environment
(S-06), the SPAWN packet as JSON text, the working folder. test_runner_command.py checks them in real agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ambient.core.errors import SpawnTemplateError
from ambient.runners.agent_env import (
    INHERITED_ENV,
    MAX_ENV_PACKET_BYTES,
    MAX_PACKET_BYTES,
    agent_cwd,
    build_env,
    encode_packet,
)
from ambient.runners.base import RunRequest, idempotency_key
from ambient.runners.runner_config import CommandRunnerConfig, parse_runner_config

TOKEN = "chan-tok-7f3e9a1c55"


def _req(brain: Path, **kw: Any) -> RunRequest:
    fields: dict[str, Any] = {
        "packet": {"from": "orchestrator", "to": "deploy", "signal": "SPAWN"},
        "agent": "deploy",
        "run_id": "run-1",
        "item": "instance-01",
        "attempt": 2,
        "key": idempotency_key("run-1", "instance-01", 2),
        "channel_token": TOKEN,
        "brain": brain,
        **kw,
    }
    return RunRequest(**fields)


def _cfg(**kw: Any) -> CommandRunnerConfig:
    cfg = parse_runner_config({"kind": "command", "argv": ["/bin/true"], **kw})
    assert isinstance(cfg, CommandRunnerConfig)
    return cfg


def test_env_is_the_inherited_basics_the_config_and_the_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", "/run/credentials/ambient.service")
    monkeypatch.setenv("SECRET_OF_THE_DAEMON", "x")
    req = _req(tmp_path, handoff="h" * 10)
    env = build_env(req, _cfg(env={"EXTRA": "1"}), encode_packet(req.packet))
    assert set(env) <= {*INHERITED_ENV, "EXTRA"} | {k for k in env if k.startswith("AMBIENT_")}
    assert env["EXTRA"] == "1" and env["PATH"]
    assert env["AMBIENT_ATTEMPT"] == "2" and env["AMBIENT_CHANNEL_TOKEN"] == TOKEN
    assert env["AMBIENT_BRAIN"] == str(tmp_path) and env["AMBIENT_HANDOFF"] == "h" * 10
    assert env["AMBIENT_PACKET"] == encode_packet(req.packet)


def test_a_big_packet_goes_to_stdin_only(tmp_path: Path) -> None:
    req = _req(tmp_path, packet={"payload": "x" * MAX_ENV_PACKET_BYTES})
    assert "AMBIENT_PACKET" not in build_env(req, _cfg(), encode_packet(req.packet))


def test_a_nul_byte_in_the_env_is_refused(tmp_path: Path) -> None:
    req = _req(tmp_path, item="a\x00b")
    with pytest.raises(SpawnTemplateError, match="AMBIENT_ITEM contains a NUL byte"):
        build_env(req, _cfg(), encode_packet(req.packet))


def test_packet_is_compact_json_within_its_cap() -> None:
    assert encode_packet({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    with pytest.raises(SpawnTemplateError, match="not JSON-serialisable"):
        encode_packet({"a": float("nan")})
    with pytest.raises(SpawnTemplateError, match=f"over {MAX_PACKET_BYTES} bytes"):
        encode_packet({"a": "x" * MAX_PACKET_BYTES})


def test_cwd_is_the_brain_or_the_configured_folder(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert agent_cwd(_req(tmp_path), _cfg()) == tmp_path
    assert agent_cwd(_req(tmp_path), _cfg(cwd="/srv")) == Path("/srv")
    assert agent_cwd(_req(tmp_path), _cfg(cwd="sub")) == tmp_path / "sub"
