"""In-process no-op agents for bench/fanout.py: ``kind: callable, target: "noop_agent:noop"``.

The daemon imports ``noop_agent`` from its ``sys.path``; the benchmark puts this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

_ANSWER = {"signal": "RETURN", "result": {"status": "ok"}}


async def noop(req: Any) -> dict[str, Any]:
    """Answer success at once (a coroutine: no worker thread)."""
    return _ANSWER
