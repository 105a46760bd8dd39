"""A worker refuses work of another brain's namespace: never run, never redelivered to it (pure of a server: the
message and the runner are stand-ins)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ambient.cluster.protocol import Work
from ambient.cluster.worker import Worker, WorkerOptions


class _Msg:
    """A JetStream message as the worker handles it: what it answered is recorded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.answers: list[str] = []

    async def ack(self) -> None:
        self.answers.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.answers.append("nak")

    async def term(self) -> None:
        self.answers.append("term")


class _Runner:
    def __init__(self) -> None:
        self.ran: list[Any] = []

    async def run(self, req: Any, cfg: Any) -> Any:
        self.ran.append(req)
        raise AssertionError("work of another namespace must not run")


class _Link:
    """Any use of the server is a failure here: the refusal happens before the attempt's entry is read."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the link was used: {name}")


def _work(namespace: str) -> Work:
    return Work(
        key="run/x/1",
        run_id="run",
        item="x",
        attempt=1,
        agent="slow",
        namespace=namespace,
        runner={"kind": "command", "argv": ["true"]},
        packet={"signal": "SPAWN"},
    )


def test_work_of_another_namespace_is_terminated_not_run(tmp_path: Path) -> None:
    runner = _Runner()
    options = WorkerOptions(urls=["nats://127.0.0.1:1"], creds=None, brain=tmp_path, agents=["slow"], namespace="alpha")
    worker = Worker(options, runner)  # type: ignore[arg-type]
    msg = _Msg(_work("beta").to_bytes())
    asyncio.run(worker.handle(_Link(), msg))
    assert msg.answers == ["term"]  # gone from the queue: a redelivery would come back to this namespace only
    assert runner.ran == [] and worker.running == set()


def test_work_of_its_own_namespace_goes_on_to_the_lease(tmp_path: Path) -> None:
    """The same message in the worker's own namespace is not refused: it reaches the attempt's entry (the link)."""
    options = WorkerOptions(urls=["nats://127.0.0.1:1"], creds=None, brain=tmp_path, agents=["slow"], namespace="alpha")
    worker = Worker(options, _Runner())  # type: ignore[arg-type]
    msg = _Msg(_work("alpha").to_bytes())
    try:
        asyncio.run(worker.handle(_Link(), msg))
    except AssertionError as exc:
        assert "the link was used: attempts" in str(exc)
    else:
        raise AssertionError("the worker did not go on to read the attempt's entry")
    assert msg.answers == []
