"""The protocol every runner stands on (runners/base.py and runners/result.py, and the dispatch of
runners/__init__.py): the request of one SPAWN, the result that comes back, the runner picked by kind.

Runner configs: test_runner_config.py; argv templating: test_argv.py; the agent protocol: test_answer.py; the
command runner running real agents: test_runner_command.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ambient.runners import AgentResult, Runners, RunRequest, idempotency_key, parse_runner_config

TOKEN = "chan-tok-7f3e9a1c55"


class TestDispatch:
    """Runners: one runner per kind."""

    def test_runners_dispatch(self) -> None:
        """Runners picks the runner by kind and refuses assisted when none is configured."""
        runners = Runners()
        assert runners.get(parse_runner_config({"kind": "command", "argv": ["x"]})) is runners.command
        assert runners.get(parse_runner_config({"kind": "callable", "target": "a:b"})) is runners.callable
        with pytest.raises(Exception, match="no assisted runner"):
            runners.get(parse_runner_config({"kind": "assisted"}))


class TestRequestAndResult:
    """What a runner is given and what it gives back."""

    def test_record_has_no_output(self) -> None:
        """to_record is small and JSON-ready."""
        res = AgentResult(status="success", output={"big": "x" * 1000}, duration_ms=5, exit_code=0)
        assert json.loads(json.dumps(res.to_record())) == {
            "status": "success",
            "signal": "RETURN",
            "duration_ms": 5,
            "exit_code": 0,
        }

    def test_token_not_in_repr(self, tmp_path: Path) -> None:
        """The channel token never shows in a request's repr."""
        req = RunRequest(
            packet={"from": "orchestrator", "to": "deploy", "signal": "SPAWN"},
            agent="deploy",
            run_id="run-1",
            item="instance-01",
            attempt=1,
            key=idempotency_key("run-1", "instance-01", 1),
            channel_token=TOKEN,
            brain=tmp_path,
        )
        assert TOKEN not in repr(req)
