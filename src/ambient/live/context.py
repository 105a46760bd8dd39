"""An agent's live context (spec/001): its thread, and the handoff kept from it as ``handoff.md``.

:class:`LiveContext` is the threads of :mod:`~ambient.live.threads` that also keep each thread's ``handoff.md``
(:func:`~ambient.live.handoff.summarise` of its newest turns, 0600, never through a symlink): rewritten after a
HANDOFF or CHECKPOINT turn and at rotation (at most once a minute, see :func:`_aged`), written or rebuilt when read
(:meth:`LiveContext.handoff_for`). The daemon, the runners' adapters and ``ambient thread`` use it.

The daemon tells it which runs have ended (:attr:`LiveContext.settled`): a handoff shows only the requests still open,
and one that named a run since ended is rebuilt when it is read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ambient.core.errors import InputError
from ambient.core.lazylog import get_logger
from ambient.live.handoff import HANDOFF_MAX_CHARS, Settled, runs_named, summarise
from ambient.live.threads import LOG_NAME, Threads
from ambient.live.turn import cut
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir, read_capped
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

HANDOFF_NAME = "handoff.md"
HANDOFF_MAX_AGE_S = 60.0  # a handoff.md read this long after it was written, with turns since, is rebuilt first
# Signals after which the handoff is rewritten (spec/001: handoff at session change and checkpoints).
HANDOFF_SIGNALS = frozenset({"HANDOFF", "CHECKPOINT"})


def _aged(handoff: Path) -> bool:
    """Whether a rotation should rewrite ``handoff``: it is missing, or was written ``HANDOFF_MAX_AGE_S`` ago or more.

    A rewrite summarises the newest 2,000 turns (~80-190 ms of a worker thread's GIL time here), and a fan-out
    rotates a MiB of turns every ~1,700 items: in one daemon running fan-outs back to back, every run after the
    first paid one or two of them while its items ran (bench/fanout.py (a): warm runs 10-25 % slower than the
    cold one). A reader still gets a summary at most a minute old: :meth:`LiveContext.handoff_for` rebuilds one
    read more than ``HANDOFF_MAX_AGE_S`` after it was written when turns came since (during a burst of rotations
    handoff.md may now lag the thread by up to that minute, where it lagged by at most one rotated file).
    """
    try:
        written = handoff.stat().st_mtime
    except OSError:
        return True
    return time.time() - written >= HANDOFF_MAX_AGE_S


class LiveContext(Threads):
    """The live threads of a brain, each with its ``handoff.md``: what a runner gives the agent (:meth:`handoff_for`).

    An append rewrites ``handoff.md`` after a HANDOFF or CHECKPOINT turn, and after a rotation unless it was
    written less than ``HANDOFF_MAX_AGE_S`` ago (see :func:`_aged`).
    """

    def __init__(self, paths: BrainPaths, *, settled: Settled | None = None, **threads: Any) -> None:
        super().__init__(paths, **threads)
        #: Whether a run has ended (the daemon's run manager says; None: not known, as in ``ambient thread``).
        self.settled = settled
        self._named: dict[str, frozenset[str]] = {}  # agent → the runs its handoff.md, written here, names

    def _appended(self, agent: str, directory: Path, signals: set[str], rotated: bool) -> None:
        if not HANDOFF_SIGNALS.isdisjoint(signals) or (rotated and _aged(directory / HANDOFF_NAME)):
            self._write_handoff(agent)

    def _write_handoff(self, agent: str) -> str:
        turns = self.recent_turns(agent)
        text = summarise(turns, agent=agent, settled=self.settled)
        atomic_write(self.thread_dir(agent) / HANDOFF_NAME, text, mode=PRIVATE_FILE)
        self._named[agent] = runs_named(turns, self.settled)
        return text

    def _names_ended_run(self, agent: str) -> bool:
        """Whether ``handoff.md`` may show a request of a run that has since ended: it names one, or it was not
        written by this process (then it is rebuilt once)."""
        if self.settled is None:
            return False
        named = self._named.get(agent)
        return named is None or any(self.settled(run) for run in named)

    def handoff_for(self, agent: str) -> str:
        """What a runner gives the agent: ``handoff.md``, at most 4096 characters. Never the raw transcript.

        ``handoff.md`` is rewritten after a HANDOFF or CHECKPOINT turn and at rotation; it is also written here
        when a thread has none yet, and rebuilt here when it is read more than ``HANDOFF_MAX_AGE_S`` after it was
        written and turns came since. Summarising on every read instead (the file was only written by those
        turns) parsed the newest 2,000 turns each time: ~160 ms of CPU and 4.6 MB at once for every run's first
        spawn of an agent (R-12's soak: most of the daemon's time, and its RSS ratcheting up).
        A thread folder that is a symlink is neither read nor written: the agent gets an empty handoff (logged).
        """
        d = self.thread_dir(agent)
        if d.is_symlink():
            try:
                private_dir(d)
            except InputError as exc:
                log.warning("thread_refused", agent=agent, error=str(exc))
                return summarise([], agent=agent)
        path = d / HANDOFF_NAME
        try:
            raw = read_capped(path, 64 * 1024)
        except FileNotFoundError:
            return self._rebuild_handoff(agent) if d.is_dir() else summarise([], agent=agent)
        except InputError:  # not a regular file, a symlink or too big: summarised, and that file left alone
            return summarise(self.recent_turns(agent), agent=agent, settled=self.settled)
        if self._outdated(path, d / LOG_NAME) or self._names_ended_run(agent):
            return self._rebuild_handoff(agent)
        text = raw.decode("utf-8", "replace")
        return text if len(text) <= HANDOFF_MAX_CHARS else cut(text, HANDOFF_MAX_CHARS)

    @staticmethod
    def _outdated(handoff: Path, thread_log: Path) -> bool:
        try:
            written = handoff.stat().st_mtime
            appended = thread_log.stat().st_mtime
        except FileNotFoundError:
            return False
        return appended > written and time.time() - written > HANDOFF_MAX_AGE_S

    def _rebuild_handoff(self, agent: str) -> str:
        """The summary, kept as ``handoff.md`` when it can be: an agent is not refused its handoff because the
        file could not be written (disk full, a read-only copy of the brain)."""
        try:
            with self._locked(private_dir(self.thread_dir(agent))):
                return self._write_handoff(agent)
        except (OSError, InputError) as exc:
            log.warning("handoff_not_written", agent=agent, error=str(exc))
            return summarise(self.recent_turns(agent), agent=agent, settled=self.settled)
