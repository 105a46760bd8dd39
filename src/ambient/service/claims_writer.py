"""The claims port of the run executors: claims mirror runs (one pilote claim per run, one satellite claim per item
or step), written by :class:`ClaimsWriter` in a writer thread of its own, coalesced for a fan-out's items."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from ambient.claims.claim import Claim, new_claim, new_claim_doc
from ambient.claims.store import ClaimStore
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError, InputError
from ambient.core.health import resource_of
from ambient.core.lazylog import get_logger
from ambient.engine.runs import item_claim_id
from ambient.engine.runstate import ItemState, RunState
from ambient.service.writer_threads import background_executor
from ambient.workflows.templating import has_variables, render
from ambient.workflows.variables import item_values, step_values

log = get_logger(__name__)


_ITEM_STATUS = {
    "pending": "open",
    "running": "open",
    "retry_wait": "open",
    "done": "closed",
    "failed": "failed",
    "escalated": "waiting_human",
    "skipped": "closed",
    "aborted": "failed",
}


class ClaimsWriter:
    """Claims mirror runs: one pilote claim per run, one satellite claim per item or step.

    They are views of the run journal (the fsync'd truth); a restart rewrites them from the journal. Each is
    on disk before its name points at it, so that a power cut leaves it old or new, never empty or torn (R-03
    found empty and garbled item claims that ambient then refused to overwrite, as it must a person's broken
    file): the writer thread writes a batch of claims, fsyncs them together and renames them
    (:meth:`ClaimStore.write_claims`); the fsyncs wait in that thread, not on the loop.

    for_each item claims are coalesced: a finished (or escalated) item's claim is written at most
    ``FLUSH_DELAY_S`` after the change, a started item's at most ``OPEN_DELAY_S`` after it, unless the item
    finishes first: then only its final claim is written. bench/fanout.py: creating a claim file (a create and a
    rename in a churning folder) is the costliest part of an item, and the writer thread's work stalls the event
    loop through the GIL; an item that ends within a second is written once. The run's ``accepted`` record,
    fsync'd before the agent starts, is what makes an item accepted; its claim is a view that follows. Chain step
    claims are written at once (pre-flight reads them before the agent writes).
    """

    FLUSH_DELAY_S = 0.05
    OPEN_DELAY_S = 1.0
    CHUNK = 64  # claims the writer thread writes at a time: a stop leaves the rest between two chunks

    def __init__(self, store: ClaimStore, clock: Clock, workflow_scope: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, dict[str, Any]] = {}  # the last document written, by sess_id
        self._scopes: dict[str, str] = {}  # item claim → its rendered scope
        self._pending: dict[str, tuple[RunState, ItemState, float]] = {}  # sess_id → (run, item, due: loop time)
        self._flush_at: asyncio.TimerHandle | None = None
        # One writer thread, so writes of a claim land in the order they were made; file creation is the cost
        # on slow disks, and it must not stall the event loop. Below the loop's priority: see writer_threads.
        self._writer = background_executor("claims")
        self._inflight: Future[None] | None = None
        # Claims a full disk kept from being written, by sess_id: the writer thread's own (no lock needed);
        # written again at the end of the shortage (retry_unwritten), unless a newer version made it first.
        self._unwritten: dict[str, tuple[Claim, dict[str, Any]]] = {}
        # A stop past its time: the writer thread writes nothing more (see aclose). Counts of claims handed to the
        # thread and done by it (each written by one side only) say how many a stop left to the journals.
        self._abandoned = False
        self._queued = 0
        self._done = 0

    def flush(self, *, wait: bool = False) -> None:
        """Write every pending item claim (a run's end, shutdown with ``wait``)."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        pending, self._pending = self._pending, {}
        self._write_items(pending.values())
        if wait and self._inflight is not None:
            self._inflight.result()

    def _flush_due(self) -> None:
        """The coalescing timer: write the claims that are due, wait for the others."""
        self._flush_at = None
        loop = asyncio.get_running_loop()
        horizon = loop.time() + 0.01  # what falls due within 10 ms goes with this batch
        due = {k: v for k, v in self._pending.items() if v[2] <= horizon}
        for k in due:
            del self._pending[k]
        self._write_items(due.values())
        if self._pending:
            self._arm(loop, min(v[2] for v in self._pending.values()))

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._flush_at is not None:
            if self._flush_at.when() <= when:
                return
            self._flush_at.cancel()
        self._flush_at = loop.call_at(when, self._flush_due)

    def _write_items(self, pending: Iterable[tuple[RunState, ItemState, float]]) -> None:
        claims: list[tuple[Claim, dict[str, Any]]] = []
        for state, item, _due in pending:
            try:  # built on the loop (the run state lives there); written in the writer thread
                claim = self._prepare_item(state, item)
            except Exception as exc:  # noqa: BLE001 - one bad claim view must not lose the others (timer callback)
                log.error("claim_view_failed", run_id=state.run_id, item=item.name, error=repr(exc))
                continue
            if claim is not None:
                claims.append((claim, self._cache[claim.sess_id]))  # the validated document rides along
        if claims:
            self._queued += len(claims)
            self._inflight = self._writer.submit(self._write_many, claims)

    def close(self) -> None:
        """Write what is pending and stop the writer thread."""
        self.flush(wait=True)
        self._writer.shutdown(wait=True)

    async def aclose(self, within_s: float) -> int:
        """Write what is pending for at most ``within_s`` seconds, then stop the writer thread; how many claims were
        left unwritten.

        A stop must not wait on a backlog that grows with a fan-out (three 1,000-item fan-outs left 15 s of claim
        writes; systemd kills a daemon that does not stop within ``TimeoutStopSec``). What is left is not lost:
        claims are views of the run journals, and the next start writes them again from there (every touched item
        of an unfinished run; every claim of a finished run whose run claim, written last, is older than its end).
        """
        self.flush()
        last = self._inflight
        if last is not None:
            await asyncio.to_thread(concurrent.futures.wait, [last], within_s)
        left = self._queued - self._done
        if left > 0:
            self._abandoned = True  # the thread stops after the chunk it is writing
            log.warning("claims_left_to_the_journal", claims=left, after_s=round(within_s, 2))
        self._writer.shutdown(wait=False, cancel_futures=True)
        return max(left, 0)

    def _write_many(self, claims: list[tuple[Claim, dict[str, Any]]], *, counted: bool = True) -> None:
        """In the writer thread: the claims, a chunk at a time (``counted``: they were counted in ``_queued``)."""
        for start in range(0, len(claims), self.CHUNK):
            if self._abandoned:
                return
            chunk = claims[start : start + self.CHUNK]
            self._write_chunk(chunk)
            if counted:
                self._done += len(chunk)

    def _write_chunk(self, claims: list[tuple[Claim, dict[str, Any]]]) -> None:
        try:
            failed = self.store.write_claims(claims, durable=True)
        except (AmbientError, OSError) as exc:  # the guard or the folder itself: nothing of the batch was written
            log.warning("claim_write_failed", claims=len(claims), error=str(exc))
            failed = [(claim.sess_id, exc) for claim, _doc in claims]
        else:
            for sess_id, error in failed:
                log.warning("claim_write_failed", claim=sess_id, error=str(error))
        self._note_unwritten(claims, failed)

    def _store(self, claim: Claim) -> None:
        if self._abandoned:
            return
        try:
            self.store.write_claim(claim, durable=True)
        except (AmbientError, OSError) as exc:  # a claim the person broke or replaced: report, go on
            log.warning("claim_write_failed", claim=claim.sess_id, error=str(exc))
            self._note_unwritten([(claim, claim.to_document())], [(claim.sess_id, exc)])
        else:
            self._unwritten.pop(claim.sess_id, None)
        finally:
            self._done += 1

    def _note_unwritten(
        self, claims: list[tuple[Claim, dict[str, Any]]], failed: Iterable[tuple[str, BaseException]]
    ) -> None:
        """In the writer thread: remember the claims a full disk (or no descriptor) kept from disk, forget those
        written since."""
        short = {sess_id for sess_id, error in failed if resource_of(error)}
        for claim, doc in claims:
            if claim.sess_id in short:
                self._unwritten[claim.sess_id] = (claim, doc)
            else:
                self._unwritten.pop(claim.sess_id, None)

    def retry_unwritten(self) -> None:
        """The shortage is over: write the claims it kept from disk (in the writer thread, after what is queued)."""
        with contextlib.suppress(RuntimeError):  # stopped meanwhile: the next start writes them from the journals
            self._writer.submit(self._retry)

    def _retry(self) -> None:
        claims, self._unwritten = list(self._unwritten.values()), {}
        if claims and not self._abandoned:
            log.info("claims_rewritten", count=len(claims))
            self._write_many(claims, counted=False)

    def _prepare(self, sess_id: str, base: dict[str, Any]) -> Claim | None:
        # Performance (bench/fanout.py): the last document is kept and compared as a dict, and only a changed one
        # is validated; building, dumping and comparing models cost ~100 µs per item on the loop.
        old = self._cache.get(sess_id)
        doc = {**old, **base} if old is not None else base
        if old is not None and doc == old:
            return None
        claim = Claim.model_validate(doc)
        self._cache[sess_id] = doc
        return claim

    def _write(self, sess_id: str, base: dict[str, Any]) -> None:
        claim = self._prepare(sess_id, base)
        if claim is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (tools, tests): write at once, after what is queued
            if self._inflight is not None:
                self._inflight.result()
            self._store(claim)
            return
        # Queued behind the item claims (one writer thread, in order): the loop never waits for the disk here.
        # It did (flush(wait=True)): 1.7 s at the end of a 2,000-item fan-out, measured with cProfile.
        self._queued += 1
        self._inflight = self._writer.submit(self._store, claim)

    def run_changed(self, state: RunState) -> None:
        self.flush()  # the item claims first: a closed run claim lists children that are written
        now = self.clock.now()
        status = "open"
        if state.finished:
            status = "closed" if state.outcome in ("success", "partial") else "failed"
        elif state.escalations and not any(i.status in ("running", "pending", "retry_wait") for i in state.items):
            status = "waiting_human"
        base = new_claim(
            state.run_id, "pilote", f"workflows/{state.workflow}", "ambient", _parse(state.started_at) or now
        ).to_document()
        counts = state.counts()
        base.update(
            status=status,
            workflow=state.workflow,
            story_angle=f"ambient run of {state.workflow}",
            ambient_run={
                "form": state.form,
                "spec_hash": state.spec_hash,
                "total": counts["total"],
                "done": counts.get("done", 0),
                "escalations": state.escalation_count,
            },
        )
        if state.mode:
            base["mode"] = state.mode
        if state.finished:
            base["closed_at"] = _fmt(_parse(state.finished_at) or now)
            base["result"] = {
                "status": {"success": "ok", "partial": "partial"}.get(state.outcome or "", "failed"),
                "children": [item_claim_id(state.run_id, i, state.form) for i in state.items],
            }
        self._write(state.run_id, base)
        if state.finished:  # its claims will not change again: forget what was kept to compare them
            self._cache.pop(state.run_id, None)
            for item in state.items:
                sid = item_claim_id(state.run_id, item, state.form)
                self._cache.pop(sid, None)
                self._scopes.pop(sid, None)

    def item_changed(self, state: RunState, item: ItemState) -> None:
        if state.form != "for_each":
            self._write_item(state, item)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (tools, tests): write at once
            self._pending[item_claim_id(state.run_id, item, state.form)] = (state, item, 0.0)
            self.flush()
            return
        sess = item_claim_id(state.run_id, item, state.form)
        delay = self.OPEN_DELAY_S if item.status in ("pending", "running", "retry_wait") else self.FLUSH_DELAY_S
        due = loop.time() + delay
        before = self._pending.get(sess)
        if before is not None:
            due = min(due, before[2])  # never later than an earlier change was promised
        self._pending[sess] = (state, item, due)
        self._arm(loop, due)

    def _write_item(self, state: RunState, item: ItemState) -> None:
        claim = self._prepare_item(state, item)
        if claim is not None:
            if self._inflight is not None:
                self._inflight.result()
            self._store(claim)

    def _prepare_item(self, state: RunState, item: ItemState) -> Claim | None:
        now = self.clock.now()
        sess = item_claim_id(state.run_id, item, state.form)
        spec_scope = self._scopes.get(sess)
        if spec_scope is None:  # rendered once per item: it depends only on the pinned spec and the item
            spec_scope = self._scopes[sess] = _item_scope(state, item)
        base = new_claim_doc(sess, "satellite", spec_scope, _item_agent(state, item), now)
        if sess in self._cache:
            base.pop("opened_at", None)
        base.update(
            status=_ITEM_STATUS.get(item.status, "open"),
            parent_satellite=state.run_id,
            workflow=state.workflow,
            story_angle=f"{state.workflow}: {item.name}",
            satellite_level="leaf",
            attempt=item.attempt,
        )
        if state.form == "chain":
            base["workflow_step"] = item.name
            step_type = _step_type(state, item)
            if step_type:
                base["satellite_type"] = step_type
        if item.escalation:
            base["escalation"] = item.escalation
        if item.status in ("done", "failed", "skipped", "aborted"):
            said = item.output.get("status") if isinstance(item.output, dict) else None
            done = "partial" if said == "partial" else "ok"  # the agent's own word: a partial result stays partial
            result: dict[str, Any] = {
                "status": done if item.status == "done" else ("partial" if item.status == "skipped" else "failed")
            }
            if isinstance(item.output, dict) and isinstance(item.output.get("tests"), dict):
                result["tests"] = item.output["tests"]
            if item.error:
                result["notes"] = item.error[:500]
            base["result"] = result
            base["closed_at"] = _fmt(now)
        return self._prepare(sess, base)


def _item_scope(state: RunState, item: ItemState) -> str:
    if state.form == "chain":
        for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
            if isinstance(step, dict) and str(step.get("step")) == item.name:
                return _step_scope(state, item, str(step.get("scope") or ""))
        return item.name.partition("@")[2] or "-"
    fe = state.spec.get("for_each")
    files = fe.get("scope", {}).get("files") if isinstance(fe, dict) and isinstance(fe.get("scope"), dict) else None
    if isinstance(files, list) and files and isinstance(files[0], str):
        values = item_values(
            item=item.name, index=item.index + 1, total=len(state.items), workflow=state.workflow, run_id=state.run_id
        )
        try:
            return render(files[0], values)
        except InputError:
            pass
    return f"{state.workflow}/{item.name}"


def _step_scope(state: RunState, item: ItemState, scope: str) -> str:
    """A step's scope as its SPAWN carries it: rendered as ChainExecutor renders it (pre-flight compares the two)."""
    if not has_variables(scope):
        return scope
    prior = next((it.output for it in reversed(state.items[: item.index]) if it.status == "done"), None)
    values = step_values(
        workflow=state.workflow,
        step=item.name,
        run_id=state.run_id,
        prior=prior,
        branch=str(state.spec.get("branch") or ""),
        pilote=str(state.spec.get("pilote") or ""),
    )
    try:
        return render(scope, values)
    except InputError:
        return scope  # the step fails at its SPAWN, saying why


def _item_agent(state: RunState, item: ItemState) -> str:
    fe = state.spec.get("for_each")
    if isinstance(fe, dict) and fe.get("spawn"):
        return str(fe["spawn"])
    for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
        if isinstance(step, dict) and str(step.get("step")) == item.name and step.get("agents"):
            return str(step["agents"][0])
    return "ambient"


def _step_type(state: RunState, item: ItemState) -> str | None:
    for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
        if isinstance(step, dict) and str(step.get("step")) == item.name:
            return str(step.get("type")) if step.get("type") else None
    return item.name.partition("@")[0] or None


def _parse(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _fmt(dt: datetime) -> str:
    return dt.astimezone().strftime("%Y-%m-%dT%H:%M")
