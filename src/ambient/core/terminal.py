"""Text shown on a person's terminal: what a terminal would act on is escaped, visibly.

Agents are less trusted than the person reading ``ambient status``: an error message carrying ``ESC ]0;...BEL``
could retitle their terminal, ``ESC [2J`` clear it, a C1 ``CSI`` do the same on terminals that take 8-bit
controls, a carriage return overwrite the start of a line, and a bidi override reorder what they read (Trojan
Source). The CLI and the console log renderer pass what they show through :func:`printable`, which writes each
such character as its escape (``\\x1b``, ``\\u202e``), like ``cat -v``: the person still sees that something was
there. Newlines and tabs stay (messages and tracebacks span lines). JSON output (``--json``) keeps its values:
:func:`printable_json` writes the characters ``json`` leaves raw as JSON ``\\u`` escapes (four hex digits), which
decode to the same text.
"""

from __future__ import annotations

import json
import re
from typing import Final

#: C0 controls but tab and newline, DEL, C1 controls, the Arabic letter mark, LRM/RLM, the line and paragraph
#: separators, the bidi embeddings and overrides (U+202A-E) and isolates (U+2066-9).
_UNSAFE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as its escape; unchanged if there is none."""
    if _UNSAFE.search(text) is None:  # the common case: no copy
        return text
    return _UNSAFE.sub(_escape, text)


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable_json(text: str) -> str:
    """JSON text with the characters :func:`printable` escapes written as JSON escapes (same value once parsed).

    ``json.dumps(..., ensure_ascii=False)`` escapes C0 controls but writes DEL, C1 controls and bidi characters
    as they are; outside strings JSON text has none of them, so every match is inside a string.
    """
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape_json, text)


#: What :func:`one_line` escapes: what :func:`printable` does, and newlines and tabs too.
_LINE_BREAKING: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """``text`` for a one-line view (``status``, ``runs``, ``escalations``...: one entry per line): every character
    :func:`printable` escapes, and newline and tab as well, so a name from a file cannot forge a line of its own."""
    if _LINE_BREAKING.search(text) is None:
        return text
    return _LINE_BREAKING.sub(_escape_short, text)


_SHORT: Final = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_short(match: re.Match[str]) -> str:
    return _SHORT.get(match.group()) or _escape(match)


def control_character(text: str) -> str | None:
    """The first character of ``text`` :func:`one_line` would escape, as its escape (``\\n``), or None."""
    found = _LINE_BREAKING.search(text)
    return None if found is None else _escape_short(found)


def quoted(text: str) -> str:
    """``text`` between double quotes, as a JSON string: quotes, backslashes and every character :func:`printable`
    escapes written as escapes (``\\n``, ``\\u001b``), so a quote of what a program printed reads as text and cannot
    act on the terminal."""
    return printable_json(json.dumps(text, ensure_ascii=False))
