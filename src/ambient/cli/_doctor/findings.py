"""What a doctor check returns (:class:`Finding`), and the helpers the checks share: durations as a person reads
them, at most :data:`MAX_LINES` lines per check and kind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Literal

Severity = Literal["error", "warning", "info"]

#: At most this many lines per check and kind; the rest is summed up in one line.
MAX_LINES = 10
#: Errors first, then warnings, then infos.
ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One thing doctor found: how bad, what, where, and how to fix it."""

    severity: Severity
    check: str
    message: str
    hint: str = ""
    file: str | None = None
    line: int | None = None

    def text(self) -> str:
        """``severity  file:line: message | fix: hint`` on one line."""
        where = f"{self.file}:{self.line}: " if self.file and self.line else f"{self.file}: " if self.file else ""
        fix = f" | fix: {self.hint}" if self.hint else ""
        return f"{self.severity:<7}  {where}{self.message}{fix}"


def ago(delta: timedelta) -> str:
    """A duration in the unit a person reads it in: minutes, hours, days and hours."""
    s = max(0, int(delta.total_seconds()))
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h"
    days, hours = s // 86400, s % 86400 // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def capped(findings: list[Finding], what: str) -> list[Finding]:
    """At most MAX_LINES findings; the rest summed up in one line of the same severity and fix."""
    if len(findings) <= MAX_LINES:
        return findings
    rest = findings[MAX_LINES:]
    worst = min((f.severity for f in rest), key=ORDER.__getitem__)
    return [*findings[:MAX_LINES], Finding(worst, rest[0].check, f"... and {len(rest)} more {what}", rest[0].hint)]


def mtime(path: Path) -> float | None:
    """When ``path`` was last modified (the link itself), None when it is not there."""
    try:
        return path.lstat().st_mtime
    except OSError:
        return None
