"""Problem reports: what `ambient validate` prints and what a bad file becomes instead of a crash."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Severity = Literal["error", "warning"]


class Problem(BaseModel):
    """One finding about one file, printable as ``file:line: message``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    line: int | None = None
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{where}: {prefix}{self.message}"
