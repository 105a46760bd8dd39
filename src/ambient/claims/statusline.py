"""A claim's status read from its text alone, without parsing the YAML: for a scan over every claim file that only
needs to know which ones may be open (the daemon's stale-claims evaluator). Pure: bytes in, an answer out.
"""

from __future__ import annotations

import re

from ambient.storage.yamltext import MAX_CLAIM_BYTES

#: A top-level ``status:`` line of a block-mapping claim (column 0: a line inside a block or quoted scalar of a
#: top-level key is indented), its value plain or quoted, an end-of-line comment allowed.
_STATUS_LINE = re.compile(rb"""^status[ \t]*:[ \t]+(["']?)([A-Za-z_]+)\1[ \t]*(?:#[^\n]*)?\r?$""", re.MULTILINE)


def surely_not_open(text: bytes) -> bool:
    """Whether a claim file's text (read up to one byte past :data:`MAX_CLAIM_BYTES`) surely is not an open claim:
    exactly one top-level ``status:`` line, not ``open``. Anything unusual (no such line, two of them, flow style,
    over the size cap) answers False: the file must be parsed."""
    if len(text) > MAX_CLAIM_BYTES:
        return False
    found = _STATUS_LINE.findall(text)
    return len(found) == 1 and found[0][1] != b"open"
