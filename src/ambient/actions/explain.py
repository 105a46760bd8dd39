"""The access matrix asked about one packet (``ambient matrix explain``, the console's explain form): allow or
deny FROM → TO with SIGNAL, and the rule that decided, by :func:`ambient.kernel.matrix.decide` itself on the
brain's matrix as the router builds it. Bad input raises :class:`~ambient.core.errors.InputError` with the message
a person reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ambient.core.errors import InputError
from ambient.kernel.matrix import Decision, MatrixRow, decide, describe
from ambient.kernel.packet import ZONE_PATTERN, Signal
from ambient.kernel.routing_table import BrainMatrix, build_matrix
from ambient.storage.fsutil import check_relative, resolve_in_brain
from ambient.storage.paths import BrainPaths


@dataclass(frozen=True)
class Explained:
    """The verdict on one packet: the decision, the packet as asked (one line) and the matrix's load problems."""

    sender: str
    receiver: str
    signal: str
    zone: str | None
    files: list[str]
    decision: Decision
    problems: list[str]

    @property
    def packet(self) -> str:
        """``a → b SIGNAL zone Z files f, g``."""
        zone = f" zone {self.zone}" if self.zone else ""
        files_text = f" files {', '.join(self.files)}" if self.files else ""
        return f"{self.sender} → {self.receiver} {self.signal}{zone}{files_text}"

    def to_json(self) -> dict[str, object]:
        """What ``ambient matrix explain --json`` prints."""
        d = self.decision
        return {"allowed": d.allowed, "rule": d.rule, "source": d.source, "reasons": list(d.reasons)}


def load_matrix(paths: BrainPaths) -> BrainMatrix:
    """The brain's effective matrix (kernel defaults, agent gates, routing table), with its problems.

    Raises:
        InputError: the brain is not a directory.
    """
    if not paths.root.is_dir():
        raise InputError(f"{paths.root} is not a directory; expected a brain (--brain DIR)")
    return build_matrix(paths)


def agent_networks(paths: BrainPaths, matrix: BrainMatrix) -> dict[str, str]:
    """Agent → what it may reach by TCP (its runner's ``network:``, as
    :func:`ambient.runners.runner_config.network_text` says it), for the agents whose runner starts a process of
    theirs; a runner that does not load is left out (``ambient validate`` names it)."""
    from ambient.config.brain import read_settings, runner_configs  # here: `ambient matrix explain` starts fast
    from ambient.runners.runner_config import network_text

    settings = read_settings(paths, os.environ).settings
    if settings is None:
        return {}
    runners, _problems = runner_configs(matrix, settings, paths)
    return {name: text for name, cfg in sorted(runners.items()) if (text := network_text(cfg)) is not None}


def explain(
    paths: BrainPaths,
    sender: str,
    receiver: str,
    signal: str,
    *,
    zone: str | None = None,
    files: Sequence[str] = (),
    matrix: BrainMatrix | None = None,
) -> Explained:
    """Decide the packet as the router would and say why. Raises :class:`InputError` on bad input."""
    if signal not in Signal.__members__:
        raise InputError(f"unknown signal {signal!r}; expected one of {', '.join(Signal)}")
    if zone is not None and not re.match(ZONE_PATTERN, zone):
        raise InputError(f"{zone!r} is not a zone name (kernel, project, personal or a brain's own)")
    checked: list[str] = []
    for f in files:
        check_relative(f)  # UnsafePathError is an InputError
        if paths.root.is_dir():
            resolve_in_brain(paths.root, f)
        checked.append(f)
    bm = matrix if matrix is not None else load_matrix(paths)
    decision = decide(bm.matrix, sender, receiver, Signal(signal), zone, checked, bm.zone_rules)
    return Explained(sender, receiver, signal, zone, checked, decision, [str(p) for p in bm.problems])


@dataclass(frozen=True)
class Sends:
    """What one principal may send to each other one (signals the matrix allows, zones aside), and its entry."""

    row: MatrixRow
    to: list[tuple[str, list[str]]]  # (receiver, signals), receivers it may send nothing to left out


def sends(bm: BrainMatrix) -> list[Sends]:
    """Every principal × principal, each pair decided by :func:`ambient.kernel.matrix.decide` for every signal (no
    zone, no file): the same verdicts as ``ambient matrix explain FROM TO SIGNAL``."""
    rows = describe(bm.matrix)
    names = [r.name for r in rows]
    out = []
    for r in rows:
        to = []
        for receiver in names:
            allowed = [
                s.value for s in Signal if decide(bm.matrix, r.name, receiver, s, None, (), bm.zone_rules).allowed
            ]
            if allowed:
                to.append((receiver, allowed))
        out.append(Sends(r, to))
    return out
