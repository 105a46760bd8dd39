"""Problem reports: what `ambient validate` prints and what a bad file becomes instead of a crash."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
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


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 2, cutoff: float = 0.6) -> str:
    """``did you mean 'stats' or 'status'?`` for a word close to one or two of ``choices`` ('' if none is): how a
    misspelt command, option or key is answered, in one wording."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=n, cutoff=cutoff)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
