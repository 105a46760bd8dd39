"""The one YAML reader for every file in a brain: size cap checked on the open descriptor before
parsing, no symlink followed, UTF-8 only, no document read for more than ``PARSE_BUDGET_S`` (this module gives the
loader its clock); parsing and dumping are :mod:`ambient.storage.yamltext`'s (re-exported).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ambient.core.errors import YamlError
from ambient.storage.fsutil import read_capped
from ambient.storage.yamltext import (
    MAX_AGENT_BYTES,
    MAX_CLAIM_BYTES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_LOCK_BYTES,
    MAX_WORKFLOW_BYTES,
    PARSE_BUDGET_S,
    EventReader,
    KiB,
    LineMap,
    Loc,
    MiB,
    decode,
    dump_yaml,
    expect_mapping,
    problems_from_validation,
    split_frontmatter,
)
from ambient.storage.yamltext import parse_yaml as _parse_text

__all__ = [
    "MAX_AGENT_BYTES",
    "MAX_CLAIM_BYTES",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_LOCK_BYTES",
    "MAX_WORKFLOW_BYTES",
    "PARSE_BUDGET_S",
    "EventReader",
    "KiB",
    "LineMap",
    "Loc",
    "MiB",
    "decode",
    "dump_yaml",
    "expect_mapping",
    "load_file",
    "parse_yaml",
    "problems_from_validation",
    "split_frontmatter",
]


def parse_yaml(text: str, *, source: str = "<string>", line_offset: int = 0) -> tuple[Any, LineMap]:
    """:func:`ambient.storage.yamltext.parse_yaml` under the time budget (the monotonic clock)."""
    return _parse_text(text, source=source, line_offset=line_offset, clock=time.monotonic)


def load_file(path: Path, *, max_bytes: int, source: str | None = None) -> tuple[Any, LineMap]:
    """Read and parse a YAML file under a size cap. ``source`` names it in errors (default: the path)."""
    name = source or str(path)
    try:
        raw = read_capped(path, max_bytes)
    except YamlError:
        raise
    except OSError as exc:
        raise YamlError(f"cannot be read: {exc.strerror}", file=name) from None
    return parse_yaml(decode(raw, source=name), source=name)
