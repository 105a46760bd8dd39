"""YAML documents of the subset ambient writes are read in one pass (``yamltext._plain_document``): with the same
data and the same key lines as the safe loader, and any other document is left to the loader."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import YamlError
from ambient.storage import yamltext
from ambient.storage.yamltext import _plain_document, dump_yaml, parse_yaml

# Scalars in the subset and beside it: words YAML 1.1 reads as booleans or null, numbers of every kind, quoted
# text with and without escapes, text with indicators, empty ones.
SCALARS = [
    "ok", "deploy", "projects/bench/x.md", "sess-2026-a", "a.b", "_x", "/srv/x", "x@y+z", "Yes", "yes", "NO", "on",
    "Off", "y", "n", "true", "True", "false", "FALSE", "null", "Null", "NULL", "~", "0", "7", "-3", "012", "0x1f",
    "1_000", "-0", "+5", "1.5", ".inf", ".nan", "1e3", "2026-03-16", "2026-03-16T20:36", '"2026-03-16T20:36"',
    '"a b"', '""', '"a\\"b"', '"a\\\\b"', '"x#y"', "'single'", "a: b", "a #b", "a#b", "#c", "{}", "[]", "{a: 1}",
    "[1, 2]", "&a x", "*a", "!!str x", "!!int 3", "|", ">", "%x", "@x", "`x`", "a b", "- x", "?", ":", "=", "<<",
    "12345678901234567890", "é", "",
]  # fmt: skip
KEYS = ["a", "sess_id", "status", "b2", "_k", "on", "yes", "null", "True", "k-1", "1", "a b", "<<", "?x"]
#: Mostly what the subset holds (so that the one-pass reading is checked often), and now and then what it does not.
IN_SUBSET = ["ok", "deploy", "projects/bench/x.md", "sess-2026-a", "_x", "/srv/x", "0", "7", "-3", '"a b"', '""',
             '"x#y"', '"2026-03-16T20:36"', "null", "true", "false", "{}", "[]", "12345678"]  # fmt: skip


def _scalar(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(IN_SUBSET if draw(st.integers(0, 9)) else SCALARS))


def _key(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(KEYS[:5] if draw(st.integers(0, 9)) else KEYS))


@st.composite
def documents(draw: st.DrawFn, depth: int = 0) -> str:
    lines: list[str] = []
    for _ in range(draw(st.integers(min_value=1 if depth else 0, max_value=5))):
        key = _key(draw)
        kind = draw(st.sampled_from(["scalar"] * 12 + ["empty", "list", "list", "map", "map", "comment", "junk"]))
        if kind == "scalar":
            lines.append(f"{key}: {_scalar(draw)}")
        elif kind == "empty":
            lines.append(f"{key}:")
        elif kind == "list":
            lines.append(f"{key}:")
            pad = draw(st.sampled_from(["", "", "  "]))
            lines += [f"{pad}- {_scalar(draw)}" for _ in range(draw(st.integers(1, 3)))]
        elif kind == "map" and depth < 3:
            lines.append(f"{key}:")
            pad = draw(st.sampled_from(["  "] * 8 + ["    ", " "]))
            lines += [pad + line if line else line for line in draw(documents(depth + 1)).splitlines()]
        elif kind == "comment":
            lines.append(draw(st.sampled_from(["# a comment", "", "  # indented comment", "---", "..."])))
        else:
            lines.append(draw(st.sampled_from(["\tk: v", "k:  v", "k: v ", "k:v", " k: v", "-", "k: v\r", "k: \x07"])))
    # Spaces ending a line now and then (a hand-written ``result: `` before its nested mapping).
    lines = [line + " " * draw(st.sampled_from([0] * 9 + [1, 2])) for line in lines]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


def _loader(text: str) -> tuple[Any, dict[Any, int]] | str:
    """What the safe loader alone makes of ``text`` (its error's text when it refuses it)."""
    real = yamltext._plain_document
    try:
        yamltext._plain_document = lambda _text: None  # type: ignore[assignment]
        data, lines = parse_yaml(text)
    except YamlError as exc:
        return str(exc)
    finally:
        yamltext._plain_document = real  # type: ignore[assignment]
    return data, lines.lines


@settings(max_examples=3000, deadline=None)
@given(documents())
def test_a_document_read_in_one_pass_is_read_as_the_loader_reads_it(text: str) -> None:
    plain = _plain_document(text)
    if plain is not None:
        assert _loader(text) == (plain[0], plain[1]), text


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "sess_id", "status", "b2", "_k", "opened_at"]),
        st.one_of(
            st.sampled_from(["ok", "closed", "projects/x.md", "2026-03-16T20:36:00+00:00", "a b", None, True, 3]),
            st.lists(st.sampled_from(["a", "sess-1", "2026-03-16"]), max_size=3),
            st.dictionaries(st.sampled_from(["status", "note"]), st.sampled_from(["ok", "x y", None]), max_size=2),
        ),
        min_size=1,
    )
)
def test_what_ambient_writes_is_read_in_one_pass(data: dict[str, Any]) -> None:
    """Claims and the other small documents ambient writes (``dump_yaml``'s direct path) take the fast path."""
    text = dump_yaml(data)
    plain = _plain_document(text)
    assert plain is not None, text
    assert plain[0] == data and _loader(text) == plain


def test_a_claim_as_the_claims_writer_leaves_it() -> None:
    text = (
        "sess_id: sess-20261207-1456-bench-00000-item-000\ntype: satellite\nscope: projects/bench/x.md\n"
        'agent: deploy\nstatus: closed\nopened_at: "2026-10-08T14:56:01+00:00"\nparent_satellite: sess-1\n'
        'workflow: bench\nsatellite_level: leaf\nresult:\n  status: ok\nclosed_at: "2026-10-08T14:56"\n'
    )
    plain = _plain_document(text)
    assert plain is not None and plain[0]["result"] == {"status": "ok"}
    assert _loader(text) == plain
