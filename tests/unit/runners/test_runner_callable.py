"""The callable runner: ``"pkg.module:function"`` agents run in the daemon, by coroutine or worker thread."""

from __future__ import annotations

import asyncio
import itertools
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ambient.core.errors import ImportFromStringError
from ambient.runners import (
    AgentResult,
    CallableRunner,
    CallableRunnerConfig,
    Runners,
    RunRequest,
    import_from_string,
    parse_runner_config,
)

_counter = itertools.count()
# Shared with the agent modules written by the tests (they import this test module's state through sys.modules).
EVENTS: dict[str, Any] = {}


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Factory: write a module of agent functions in a tmp dir on sys.path; returns its unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def _write(source: str) -> str:
        name = f"agents_mod_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield _write
    for name in names:
        sys.modules.pop(name, None)
    EVENTS.clear()


@pytest.fixture
def req(tmp_path: Path) -> RunRequest:
    """A run request for the ``scribe`` agent."""
    return RunRequest(
        packet={"signal": "SPAWN", "to": "scribe"},
        agent="scribe",
        run_id="run-2",
        item="doc",
        attempt=1,
        key="run-2/doc/1",
        channel_token="tok",
        brain=tmp_path,
    )


def cfg(target: str, **kw: Any) -> CallableRunnerConfig:
    """A callable runner config."""
    result = parse_runner_config({"kind": "callable", "target": target, **kw})
    assert isinstance(result, CallableRunnerConfig)
    return result


async def test_coroutine_function(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """A coroutine function is awaited with the request; its RETURN mapping becomes the result."""
    mod = agent_module(
        """
        async def agent(req):
            return {"signal": "RETURN", "result": {"status": "ok", "item": req.item, "to": req.packet["to"]}}
        """
    )
    res = await CallableRunner().run(req, cfg(f"{mod}:agent"))
    assert (res.status, res.result) == ("success", {"status": "ok", "item": "doc", "to": "scribe"})
    assert res.exit_code is None and res.duration_ms >= 0


async def test_sync_function_runs_in_a_thread(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """A plain function runs in a worker thread, never on the loop's thread."""
    mod = agent_module(
        """
        import threading
        def agent(req):
            return {"status": "partial", "thread": threading.get_ident()}
        """
    )
    res = await CallableRunner().run(req, cfg(f"{mod}:agent"))
    assert res.status == "success" and res.result_status == "partial"
    assert res.result is not None and res.result["thread"] != threading.get_ident()


async def test_nested_attribute_and_callable_object(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """Targets may name a dotted attribute, including an object with an async __call__."""
    mod = agent_module(
        """
        class Agents:
            class Scribe:
                async def __call__(self, req):
                    return {"signal": "ESCALATE", "options": ["a", "b"]}
            scribe = Scribe()
        """
    )
    res = await CallableRunner().run(req, cfg(f"{mod}:Agents.scribe"))
    assert res.status == "escalate" and res.options == ["a", "b"]


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ("return None", "success", None),
        ("return {'signal': 'ERROR', 'context': {'error': 'disk full'}}", "error", "agent_error"),
        ("return {'signal': 'BLOCKED_ON', 'context': {'missing': 'token'}}", "blocked", None),
        ("return {'status': 'failed'}", "fail", "agent_failed"),
        ("return {'signal': 'RETURN', 'from': 'human', 'result': {}}", "error", "sender_mismatch"),
        ("return [1, 2]", "error", "bad_output"),
        ("raise ValueError('bad input 42')", "error", "exception"),
    ],
)
async def test_return_values(
    agent_module: Callable[[str], str], req: RunRequest, body: str, status: str, reason: str | None
) -> None:
    """Return values follow the agent protocol; exceptions become error results."""
    mod = agent_module(f"async def agent(req):\n    {body}\n")
    res = await CallableRunner().run(req, cfg(f"{mod}:agent"))
    assert (res.status, res.reason) == (status, reason)
    if reason == "exception":
        assert res.error == "ValueError: bad input 42"


async def test_agent_result_passes_through(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """A function may return an AgentResult directly; the runner fills in the duration."""
    mod = agent_module(
        """
        from ambient.runners import AgentResult
        def agent(req):
            return AgentResult(status="fail", reason="agent_failed", error="nope")
        """
    )
    res = await CallableRunner().run(req, cfg(f"{mod}:agent"))
    assert isinstance(res, AgentResult) and (res.status, res.error) == ("fail", "nope")


@pytest.mark.slow
async def test_timeout_cancels_coroutine(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """A coroutine over its timeout is cancelled (its finally runs) and the result is a timeout error."""
    mod = agent_module(
        """
        import asyncio
        from tests.unit.runners.test_runner_callable import EVENTS
        async def agent(req):
            try:
                await asyncio.Event().wait()
            finally:
                EVENTS["cleaned"] = True
        """
    )
    res = await CallableRunner().run(req, cfg(f"{mod}:agent", timeout_s=0.2))
    assert (res.status, res.reason) == ("error", "timeout")
    assert EVENTS["cleaned"] is True


@pytest.mark.slow
async def test_timeout_of_sync_function(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """A sync function over its timeout gives a timeout error; the loop is not blocked meanwhile."""
    release = threading.Event()
    EVENTS["release"] = release
    mod = agent_module(
        """
        from tests.unit.runners.test_runner_callable import EVENTS
        def agent(req):
            EVENTS["release"].wait(30)
            return {"status": "ok"}
        """
    )
    try:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        res = await CallableRunner().run(req, cfg(f"{mod}:agent", timeout_s=0.3))
        tick_task.cancel()
        assert (res.status, res.reason) == ("error", "timeout")
        assert ticks > 5
    finally:
        release.set()


async def test_cancellation_propagates(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """Cancelling the run cancels the agent coroutine and re-raises CancelledError."""
    started = asyncio.Event()
    EVENTS["started"] = started
    mod = agent_module(
        """
        import asyncio
        from tests.unit.runners.test_runner_callable import EVENTS
        async def agent(req):
            EVENTS["started"].set()
            try:
                await asyncio.Event().wait()
            finally:
                EVENTS["cancelled"] = True
        """
    )
    task = asyncio.create_task(CallableRunner().run(req, cfg(f"{mod}:agent")))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert EVENTS["cancelled"] is True


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("x = 1\n", "{mod}:missing", 'Attribute "missing" not found in module "{mod}".'),
        ("x = 1\n", "{mod}:x", 'Attribute "x" in module "{mod}" is not callable.'),
        ("x = 1\n", "nope_no_such_module_zz:f", 'Could not import module "nope_no_such_module_zz".'),
        ("import nope_dependency_zz\n", "{mod}:f", 'Could not import module "{mod}": No module named'),
        ("raise RuntimeError('broken at import')\n", "{mod}:f", "RuntimeError: broken at import"),
    ],
)
async def test_import_errors(
    agent_module: Callable[[str], str], req: RunRequest, source: str, target: str, message: str
) -> None:
    """Targets that cannot be loaded give a clear bad_request error (uvicorn-style messages)."""
    mod = agent_module(source)
    res = await CallableRunner().run(req, cfg(target.format(mod=mod)))
    assert (res.status, res.reason) == ("error", "bad_request")
    assert message.format(mod=mod) in (res.error or "")


def test_import_string_format() -> None:
    """A target without ':' is refused with the expected format."""
    with pytest.raises(ImportFromStringError, match='must be in format "<module>:<attribute>"'):
        import_from_string("json.dumps")


async def test_loaded_once(agent_module: Callable[[str], str], req: RunRequest) -> None:
    """The target module is imported once per runner, not once per run."""
    mod = agent_module(
        """
        from tests.unit.runners.test_runner_callable import EVENTS
        EVENTS["imports"] = EVENTS.get("imports", 0) + 1
        def agent(req):
            return None
        """
    )
    runners = Runners()
    config = cfg(f"{mod}:agent")
    for _ in range(3):
        assert (await runners.run(req, config)).ok
    assert EVENTS["imports"] == 1


async def test_wrong_config_kind(req: RunRequest) -> None:
    """A runner given another kind's config is a programming error."""
    with pytest.raises(TypeError, match="cannot run a 'command' runner config"):
        await CallableRunner().run(req, parse_runner_config({"kind": "command", "argv": ["x"]}))
