"""The assisted runner: a person or an external agent carries out the SPAWN (spec/004 "mode assisté").

It opens a claim with the brief (``claims/<session>-assisted.yml``) and waits until someone closes
it with a ``result:`` (``ambient claim close``, an editor, another tool). The claim is the contract:
restarting the daemon finds the same claim and keeps waiting, or takes the result already written.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from ambient.claims.claim import Claim, new_claim
from ambient.claims.store import ClaimStore
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import AmbientError, InputError
from ambient.core.lazylog import get_logger
from ambient.runners.answer import interpret_output
from ambient.runners.base import RunRequest
from ambient.runners.result import AgentResult, error_result
from ambient.runners.runner_config import AssistedRunnerConfig

log = get_logger(__name__)

_DONE = ("closed", "failed")


class AssistedRunner:
    """Waits for a claim to be closed with ``result:``; wakes on claim-file events (``poke``) or every ``poll_s``."""

    def __init__(self, store: ClaimStore, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self._changed = asyncio.Event()
        self.on_open: Callable[[str], None] | None = None

    def poke(self) -> None:
        """Claims changed on disk: look again now."""
        self._changed.set()

    def claim_id(self, req: RunRequest) -> str:
        base = str(req.packet.get("session_id") or req.key.replace("/", "-"))
        return f"{base}-assisted"

    async def run(self, req: RunRequest, cfg: Any) -> AgentResult:
        assert isinstance(cfg, AssistedRunnerConfig)
        sess = self.claim_id(req)
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._open, sess, req)
        except AmbientError as exc:
            return error_result("bad_request", f"cannot open the assisted claim {sess}: {exc}")
        log.info("assisted_claim_opened", claim=sess, agent=req.agent)
        if self.on_open is not None:
            self.on_open(sess)
        deadline = started + cfg.timeout_s
        while True:
            claim = await asyncio.to_thread(self._get, sess)
            if claim is not None and claim.status in _DONE:
                result = claim.model_dump().get("result")
                if not isinstance(result, dict):
                    result = {"status": "failed" if claim.status == "failed" else "ok"}
                out = interpret_output(result, agent=req.agent)
                return out.with_process(duration_ms=int((time.monotonic() - started) * 1000))
            left = deadline - time.monotonic()
            if left <= 0:
                return error_result("timeout", f"nobody closed {sess} within {cfg.timeout_s:.0f}s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(cfg.poll_s, left))

    def _get(self, sess: str) -> Claim | None:
        try:
            return self.store.get(sess)
        except InputError:
            return None  # not there (yet), or unreadable while someone edits it

    def _open(self, sess: str, req: RunRequest) -> None:
        if self._get(sess) is not None:
            return  # resumed: the claim (and maybe its result) is already there
        payload = req.packet.get("payload") if isinstance(req.packet.get("payload"), dict) else {}
        context = payload.get("context") if isinstance(payload, dict) else None
        scope_files = (req.packet.get("scope") or {}).get("files") or []
        brief = context if isinstance(context, dict) else {}
        claim = new_claim(
            sess,
            "satellite",
            scope_files[0] if scope_files else req.item,
            req.agent,
            self.clock.now(),
            story_angle=str(brief.get("story_angle") or f"{req.agent}: {req.item}"),
            parent_satellite=str(req.packet.get("session_id") or req.run_id),
            assisted={
                "key": req.key,
                "brief": brief,
                "how": "close this claim with `ambient claim close` and a result: {status: ok|partial|failed}",
            },
        )
        self.store.open(claim)
