"""The agent delegate tested alone: the shared handoff, channel-token revocation."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.storage.paths import BrainPaths


async def test_handoff_is_shared_by_a_runs_items_and_a_rewrite_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handoff per (agent, run), not one per item; a rewritten handoff.md reaches the next attempts once the
    short recheck interval has passed (it is not stat'ed for every item)."""
    from ambient.engine.ports import Attempt
    from ambient.live.context import HANDOFF_NAME, LiveContext
    from ambient.service import adapters
    from ambient.service.adapters import AgentDelegate

    live = LiveContext(BrainPaths(tmp_path))
    calls: list[str] = []
    real = live.handoff_for

    def counting(agent: str) -> str:
        calls.append(agent)
        return real(agent)

    monkeypatch.setattr(live, "handoff_for", counting)
    delegate = AgentDelegate(None, None, None, None, None, live)  # type: ignore[arg-type]

    def attempt(k: int) -> Attempt:
        return Attempt(
            run_id="run-1",
            workflow="w",
            item=f"i{k}",
            index=k,
            attempt=1,
            key=f"run-1/i{k}/1",
            agent="coder",
            sender="ambient",
        )

    monkeypatch.setattr(adapters, "HANDOFF_RECHECK_S", 3600.0)
    first = [await delegate._handoff(attempt(k)) for k in range(5)]
    assert len(calls) == 1 and len(set(first)) == 1
    folder = live.thread_dir("coder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HANDOFF_NAME).write_text("# Handoff\nnew decisions\n")
    assert await delegate._handoff(attempt(6)) == first[0]  # within the recheck interval: not looked at yet
    monkeypatch.setattr(adapters, "HANDOFF_RECHECK_S", 0.0)
    assert await delegate._handoff(attempt(7)) == "# Handoff\nnew decisions\n"
    assert len(calls) == 2


class _Runners:
    """Stands for the command runner: publishes the token as it does, then looks it up as another process would."""

    def __init__(self, paths: BrainPaths) -> None:
        self.paths = paths
        self.tokens: list[str] = []
        self.seen: list[str | None] = []

    async def run(self, req: Any, cfg: Any) -> Any:
        from ambient.kernel.channels import ChannelRegistry
        from ambient.runners.result import AgentResult

        req.before_start()
        self.tokens.append(req.channel_token)
        self.seen.append(ChannelRegistry(self.paths).principal_for(req.channel_token))
        return AgentResult(status="success", output={})


async def test_a_command_agents_token_file_is_gone_when_its_attempt_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is live for other processes while the agent runs, and its file is renamed aside by the time the
    delegate returns (on the loop, no thread hop: bench/README.md, finding 31). A rename that fails leaves the token
    void in the daemon all the same, and says so in the log."""
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from ambient.engine.ports import Attempt
    from ambient.kernel.channels import ChannelRegistry
    from ambient.kernel.packet import make_packet
    from ambient.service.adapters import AgentDelegate

    paths = BrainPaths(tmp_path)
    paths.state.mkdir()
    registry = ChannelRegistry(paths)
    runners = _Runners(paths)
    ref = SimpleNamespace(brain=SimpleNamespace(paths=paths, matrix=SimpleNamespace(agents={})))
    delegate = AgentDelegate(ref, SimpleNamespace(registry=registry), runners, None, None)  # type: ignore[arg-type]
    a = Attempt(
        run_id="run-1", workflow="w", item="i1", index=0, attempt=1, key="run-1/i1/1", agent="coder", sender="ambient"
    )
    spawn = make_packet("ambient", "coder", "SPAWN", now=datetime.now(UTC), session_id="run-1")
    cfg = SimpleNamespace(kind="command")

    await delegate._run(a, spawn, cfg)
    assert runners.seen == ["coder"]  # another process's view, while the agent ran
    assert list(paths.channels.glob("*.json")) == []  # gone already: nothing is left to a thread

    def refuse(channel: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(registry, "revoke", refuse)
    with capture_logs() as logs:
        await delegate._run(a, spawn, cfg)
    assert runners.seen == ["coder", "coder"]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["channel_revoke_failed"]
    assert len(list(paths.channels.glob("*.json"))) == 1  # the file could not go...
    assert registry.principal_for(runners.tokens[-1]) is None  # ...but the daemon never accepts the token again
    assert ChannelRegistry(paths).revoke_all() == 1  # and the next start-up removes it
