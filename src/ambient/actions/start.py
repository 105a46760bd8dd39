"""Start a run of a workflow now: the one code path of ``ambient start`` and the console's start button.

The request is an ORCHESTRATE packet from ``human`` to the daemon's inbox, checked by the access matrix first, so
the console can start nothing the CLI could not. The outcome is typed: the CLI maps it to exit codes (0 started,
1 denied by the matrix, 2 refused: bad context, unknown workflow or step, a file that does not load).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ambient.config.brain import load_brain
from ambient.core.clock import utcnow
from ambient.kernel.inbox import write_inbox
from ambient.kernel.packet import make_packet
from ambient.kernel.router import Router
from ambient.service.instance import served_workflow
from ambient.storage.paths import BrainPaths
from ambient.workflows.spec import ChainWorkflow

StartKind = Literal["started", "denied", "refused"]


@dataclass(frozen=True)
class StartOutcome:
    """``started`` (``packet_id`` set; ``warnings`` such as a broken file whose older version the daemon starts),
    ``denied`` by the access matrix, or ``refused`` (nothing was written)."""

    kind: StartKind
    message: str
    packet_id: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.kind == "started"


def parse_context(text: str | None) -> dict[str, Any] | str | None:
    """A run's context from JSON text: the object, None when blank, or why it is refused (a string)."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the context is not valid JSON: {exc}"
    except RecursionError:
        return "the context is nested too deeply to read (JSON past the decoder's depth)"
    if not isinstance(value, dict):
        return "the context must be a JSON object"
    return value


def start(
    paths: BrainPaths,
    workflow: str,
    *,
    step: str | None = None,
    context: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> StartOutcome:
    """Ask the daemon to start ``workflow`` (a chain at ``step``) with ``context``."""
    ctx: dict[str, Any] = {"workflow": workflow}
    if step:
        ctx["step"] = step
    if context is not None:
        ctx["context"] = dict(context)
    warnings: list[str] = []
    # The workflow as the daemon loads it: a request for a file that does not load would be dropped unseen. A
    # draft starts too: `status: draft` keeps a workflow from starting by itself, not from being started on purpose.
    brain = load_brain(paths, os.environ if environ is None else environ)
    loaded = brain.workflows.get(workflow)
    if loaded is None:
        mine = [p for p in brain.errors if p.file.startswith("workflows/") and Path(p.file).stem == workflow]
        if not mine:
            return StartOutcome("refused", f"no workflow named {workflow!r} in {paths.workflows}")
        problems = "; ".join(str(p) for p in mine[:3])
        serving = served_workflow(paths, workflow)
        if serving is None:
            return StartOutcome(
                "refused",
                f"{workflow} does not load, so it cannot start: {problems} (`ambient validate` lists every problem)",
            )
        # The running daemon keeps serving the version it loaded before the file broke (docs/workflows.md).
        warnings.append(f"{problems}; the running daemon starts the version it loaded before (sha256 {serving[:12]})")
    else:
        spec = loaded.spec
        if not spec.runnable:  # a draft's checks are warnings, until it is started on purpose: then they are said
            for p in brain.problems:
                if p.file == loaded.source and p.severity == "warning":
                    where = p.file if p.line is None else f"{p.file}:{p.line}"
                    warnings.append(f"{where}: {p.message}")
        if step:
            if not isinstance(spec, ChainWorkflow):
                return StartOutcome("refused", f"--step is for chains; {workflow} is a for_each")
            steps = [s.key for s in spec.chain]
            if str(step) not in steps:
                return StartOutcome("refused", f"{workflow} has no step {step!r}; its steps: {', '.join(steps)}")
    pkt = make_packet("human", "ambient", "ORCHESTRATE", now=utcnow(), context=ctx)
    router = Router(brain.matrix.matrix, zone_rules=brain.matrix.zone_rules, brain_root=paths.root)
    verdict = router.check(pkt, "human")
    if not verdict.ok:
        return StartOutcome("denied", f"ORCHESTRATE denied: {verdict.reason}")
    write_inbox(paths, pkt)
    return StartOutcome(
        "started",
        f"start requested: {workflow} (packet {pkt.id}); the daemon picks it up at once if it runs",
        packet_id=pkt.id,
        warnings=tuple(warnings),
    )
