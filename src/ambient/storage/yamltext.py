"""YAML as text: the safe parser and the order-preserving dumper (pure; no files).

Hostile-input safe (RELIABILITY S-03): pure-Python SafeLoader only (the C loader segfaults on deep
nesting), aliases refused (no alias bombs), duplicate keys refused (PyYAML silently keeps the last
one), merge keys (``<<:``) included, nesting bounded, and every error carries file and line. Timestamps stay
strings, so a claim rewritten by ambient keeps the user's ``opened_at: 2026-03-16T20:36`` text as it was.
Explicit tags: a value its tag cannot read (``!!int x``, ``!!bool maybe``), an integer past
Python's 4,300-digit limit, or a tag that makes something else than text, numbers, booleans, null, lists
and mappings (``!!binary``, ``!!set``, ``!!omap``, ``!!pairs``) is a :class:`YamlError` at the node's line:
every reader catches that one error, and nothing else escapes the loader.
A document of the narrow subset ambient itself writes (every claim: plain keys, block mappings, lists of plain
scalars) is read in one pass instead (:func:`_plain_document`), with the same data and lines; anything outside it,
hostile input included, goes to the loader.
:mod:`ambient.storage.yamlfile` adds the capped, no-follow file reading.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ambient.core.errors import YamlError
from ambient.core.problems import Problem, did_you_mean

MAX_DEPTH = 64
#: Longest a document may take to read when a clock is given (a brain file is read in milliseconds; 1 MiB of the
#: costliest YAML in a few seconds): past it, a problem at the line reached, never a loader that holds the daemon or a
#: command. :func:`ambient.storage.yamlfile.parse_yaml` gives the clock; this module stays pure.
PARSE_BUDGET_S = 10.0
MAX_INT_DIGITS = 4300  # Python's own limit for int <-> str: a longer integer could not even be printed
_INT_LIMIT = 10**MAX_INT_DIGITS
_MAX_INT_TEXT = 4 * MAX_INT_DIGITS  # longer text is refused unread (0b..., 1:59:59:... cost quadratic time)
_YAML_TAG = "tag:yaml.org,2002:"
_MERGE_TAG, _VALUE_TAG, _STR_TAG = f"{_YAML_TAG}merge", f"{_YAML_TAG}value", f"{_YAML_TAG}str"
_MERGE_OR_VALUE = frozenset({_MERGE_TAG, _VALUE_TAG})
KiB = 1024
MiB = 1024 * KiB
# Size caps per kind of file (checked before parsing).
MAX_WORKFLOW_BYTES = 1 * MiB
MAX_AGENT_BYTES = 256 * KiB
MAX_CLAIM_BYTES = 64 * KiB
MAX_LOCK_BYTES = 4 * KiB
MAX_CONFIG_BYTES = 256 * KiB

Loc = tuple[str | int, ...]


class _Resolver(yaml.resolver.Resolver):
    """YAML 1.1 implicit types, minus timestamps (kept as the user's text)."""


_Resolver.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}


class _BoundedScanner(yaml.scanner.Scanner):
    """PyYAML's scanner, refusing a flow collection (``[``, ``{``) nested past :data:`MAX_DEPTH` as it reads it:
    before its first token, the scanner looks ahead over every open level (40 KB of ``[`` cost seconds), so the
    composer's own bound came too late."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level >= MAX_DEPTH:
            line = int(getattr(self, "line", 0))  # the reader's, beside this class in every loader
            raise YamlError(f"nesting deeper than {MAX_DEPTH} levels", line=line + 1)
        super().fetch_flow_collection_start(TokenClass)


class EventReader(yaml.reader.Reader, _BoundedScanner, yaml.parser.Parser):
    """A document read as events only (no node built), under the loader's flow bound: for pre-checks that count.
    Raises :class:`YamlError` past the bound, ``yaml.YAMLError`` on malformed text."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        _BoundedScanner.__init__(self)
        yaml.parser.Parser.__init__(self)


class _SafeLoader(
    yaml.reader.Reader,
    _BoundedScanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    yaml.constructor.SafeConstructor,
    _Resolver,
):
    """Pure-Python safe loader that refuses aliases and bounds nesting."""

    def __init__(self, stream: str, clock: Callable[[], float] | None = None) -> None:
        yaml.reader.Reader.__init__(self, stream)
        _BoundedScanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0
        self._clock = clock
        self._deadline = clock() + PARSE_BUDGET_S if clock is not None else 0.0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlError(
                "YAML aliases (*name) are not accepted in a brain file; write the value out",
                line=event.start_mark.line + 1,
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlError(f"nesting deeper than {MAX_DEPTH} levels", line=event.start_mark.line + 1)
        self._nodes += 1
        if self._clock is not None and self._nodes % 256 == 0 and self._clock() > self._deadline:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlError(
                f"took more than {PARSE_BUDGET_S:g} s to read; simplify the document or split it",
                line=event.start_mark.line + 1,
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A constructor's own exception (ValueError, KeyError...) becomes a YamlError at this node's line."""
        try:
            return super().construct_object(node, deep=deep)
        except (YamlError, yaml.YAMLError, RecursionError):
            raise
        except Exception:  # noqa: BLE001 - whatever a constructor raises, the document is at fault
            raise YamlError(_unreadable(node), line=node.start_mark.line + 1) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Merge keys flattened, then every key once: a merge cannot give a key that is also given otherwise."""
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping node, but found {node.id}", node.start_mark
            )
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                seen = key in first
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                ) from None
            if seen:
                # Merged pairs come first whatever their place: report the later of the two in the text.
                a, b = sorted((first[key].start_mark.index, key_node.start_mark.index))
                lines = {m.index: m.line + 1 for m in (first[key].start_mark, key_node.start_mark)}
                raise YamlError(
                    f"duplicate key {_shown(key)} (first at line {lines[a]}); each key may appear once, "
                    "merges (<<) included",
                    line=lines[b],
                )
            first[key] = key_node
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """PyYAML's merge, minus its silent drop of a key merged twice: every merged pair is kept, for the check."""
        if not any(k.tag in _MERGE_OR_VALUE for k, _ in node.value):
            return
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                if key_node.tag == _VALUE_TAG:
                    key_node.tag = _STR_TAG
                own.append((key_node, value_node))
                continue
            subs = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for sub in subs:
                if not isinstance(sub, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {sub.id}",
                        sub.start_mark,
                    )
                self.flatten_mapping(sub)
                merged.extend(sub.value)
        node.value = merged + own

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer Python can print: at most ``MAX_INT_DIGITS`` digits, refused before any costly conversion."""
        text = str(node.value).replace("_", "").lstrip("+-")
        if len(text) > _MAX_INT_TEXT or (text.isdigit() and len(text) > MAX_INT_DIGITS):
            raise YamlError(_too_long(), line=node.start_mark.line + 1)
        value = super().construct_yaml_int(node)
        if abs(value) >= _INT_LIMIT:
            raise YamlError(_too_long(), line=node.start_mark.line + 1)
        return value

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        """``!!timestamp``: checked to be one, then kept as the user's text (as implicit timestamps are)."""
        super().construct_yaml_timestamp(node)
        return str(self.construct_scalar(node))

    def refuse_tag(self, node: yaml.Node) -> Any:
        """Tags whose values no reader expects (bytes, sets, ordered pairs): refused, not handed on."""
        raise YamlError(
            f"the tag {_short_tag(node.tag)} is not accepted in a brain file; use plain text, numbers, booleans, "
            "null, lists and mappings",
            line=node.start_mark.line + 1,
        )


_SafeLoader.add_constructor(f"{_YAML_TAG}int", _SafeLoader.construct_yaml_int)  # type: ignore[type-var]
_SafeLoader.add_constructor(f"{_YAML_TAG}timestamp", _SafeLoader.construct_yaml_timestamp)  # type: ignore[type-var]
for _tag in ("binary", "set", "omap", "pairs"):
    _SafeLoader.add_constructor(f"{_YAML_TAG}{_tag}", _SafeLoader.refuse_tag)  # type: ignore[type-var]


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def _shown(value: object, limit: int = 40) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "a long integer"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_long() -> str:
    return f"integer with more than {MAX_INT_DIGITS} digits; quote it if it is text"


def _unreadable(node: yaml.Node) -> str:
    tag = _short_tag(node.tag)
    if isinstance(node, yaml.ScalarNode):
        return f"{_shown(node.value)} is not a valid {tag}; fix the value or remove the tag"
    return f"this {getattr(node, 'id', 'node')} cannot be read as {tag}; fix it or remove the tag"


# The C emitter is six times faster than the pure-Python one (a claim is rewritten twice per item) and
# only emits our own data; it is the C *loader* that must never see hostile input (RELIABILITY S-03).
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):  # type: ignore[misc]
    """Block style, insertion order, no anchors (our own loader refuses aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


@dataclass(frozen=True)
class LineMap:
    """1-based line of every key and item of a document, by its location path."""

    lines: dict[Loc, int] = field(default_factory=dict)

    def line_for(self, loc: Sequence[str | int]) -> int | None:
        """The line of the deepest known prefix of ``loc``."""
        path = tuple(loc)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


def _walk(node: yaml.Node, path: Loc, out: dict[Loc, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # merged keys are this mapping's: their lines at its path
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for sub in merged:
                    if isinstance(sub, yaml.MappingNode):
                        _walk(sub, path, out)
            if isinstance(key_node, yaml.ScalarNode):
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise YamlError(
                        f"duplicate key {key!r} (first at line {seen[key]}); each key may appear once",
                        line=line,
                    )
                seen[key] = line
                out[(*path, key)] = line
                _walk(value_node, (*path, key), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _walk(item, (*path, i), out)


class _NotPlain(Exception):
    """A document outside :func:`_plain_document`'s subset: the safe loader reads it."""


_KEY_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):(?: (.*))?")
_QUOTED_PLAIN = re.compile(r'"[ !#-\[\]-~]*"')  # printable ASCII but " and \: the text between is the value
_DECIMAL = re.compile(r"0|-?[1-9][0-9]{0,17}")
_WORDS: dict[str, Any] = {"null": None, "true": True, "false": False}


def _plain_scalar(text: str) -> Any:
    """The value of a scalar of the subset (as the safe loader reads it), or :class:`_NotPlain`."""
    if text in _WORDS:
        return _WORDS[text]
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if _DECIMAL.fullmatch(text):
        return int(text)
    if _QUOTED_PLAIN.fullmatch(text):
        return text[1:-1]
    if _PLAIN_RE.fullmatch(text) and text.lower() not in _NOT_PLAIN:
        return text
    raise _NotPlain


def _plain_document(text: str) -> tuple[dict[str, Any], dict[Loc, int]] | None:
    """The data and key lines of a document in the subset :func:`dump_yaml`'s direct path writes (every claim
    ambient writes), read in one pass; None for anything else, which the safe loader reads.

    The subset: ASCII text, full-line comments, block mappings of plain keys, each value a scalar (plain text of
    :data:`_PLAIN_RE` that no YAML 1.1 resolver takes for another type, a double-quoted string without escapes,
    a decimal integer, ``null``, ``true``, ``false``, ``{}``, ``[]``), a nested mapping or a list of such scalars;
    no key twice, at most :data:`_FAST_MAX_DEPTH` levels. Why: the pure-Python loader spends 2-3 ms on a claim
    file, and a brain keeps every claim it ever had (20,000 of them: a minute to index); this reads one in tens of
    microseconds, with the same data and lines (tests/unit/storage/test_yamltext_plain.py checks it against the
    loader)."""
    if not text.isascii() or not text.replace("\n", "").isprintable():
        return None  # tabs, carriage returns, control characters, anything not ASCII: the loader's rules
    rows: list[tuple[int, int, str]] = []
    for number, full in enumerate(text.split("\n"), 1):
        line = full.rstrip(" ")  # spaces ending a line of the subset mean nothing (``result: `` is ``result:``)
        body = line.lstrip(" ")
        if body and not body.startswith("#"):
            rows.append((len(line) - len(body), number, body))
    if not rows or rows[0][0] != 0:
        return None
    lines: dict[Loc, int] = {(): rows[0][1]}
    at = 0

    def items(indent: int, path: Loc) -> list[Any]:
        nonlocal at
        out: list[Any] = []
        while at < len(rows) and rows[at][0] == indent and rows[at][2].startswith("- "):
            lines[(*path, len(out))] = rows[at][1]
            out.append(_plain_scalar(rows[at][2][2:]))
            at += 1
        return out

    def mapping(indent: int, path: Loc) -> dict[str, Any]:
        nonlocal at
        if len(path) > _FAST_MAX_DEPTH:
            raise _NotPlain
        out: dict[str, Any] = {}
        while at < len(rows):
            level, number, body = rows[at]
            if level < indent:
                break
            m = _KEY_LINE.fullmatch(body)
            if level > indent or m is None:
                raise _NotPlain
            key, rest = m.group(1), m.group(2)
            if key in out or key.lower() in _NOT_PLAIN:
                raise _NotPlain
            lines[(*path, key)] = number
            at += 1
            if rest is not None:
                out[key] = _plain_scalar(rest)
                continue
            nxt = rows[at] if at < len(rows) else None
            if nxt is not None and nxt[0] >= indent and nxt[2].startswith("- "):
                out[key] = items(nxt[0], (*path, key))
            elif nxt is not None and nxt[0] > indent:
                out[key] = mapping(nxt[0], (*path, key))
            else:
                out[key] = None
        return out

    try:
        data = mapping(0, ())
    except _NotPlain:
        return None
    return (data, lines) if at == len(rows) else None


def parse_yaml(
    text: str, *, source: str = "<string>", line_offset: int = 0, clock: Callable[[], float] | None = None
) -> tuple[Any, LineMap]:
    """Parse one YAML document safely; return the data and the line of every key.

    ``line_offset`` shifts reported lines (frontmatter starts after the ``---`` line); with a ``clock`` (monotonic
    seconds) the reading stops after :data:`PARSE_BUDGET_S`. A document of the subset ambient writes is read in
    one pass (:func:`_plain_document`), any other by the safe loader.
    """
    plain = _plain_document(text)
    if plain is not None:
        return plain[0], LineMap({k: v + line_offset for k, v in plain[1].items()})
    loader: _SafeLoader | None = None
    try:
        loader = _SafeLoader(text, clock)  # the reader refuses control characters here, before parsing
        node = loader.get_single_node()
        if node is None:
            return None, LineMap({})
        raw: dict[Loc, int] = {}
        _walk(node, (), raw)
        data = loader.construct_document(node)
    except YamlError as exc:
        line = exc.line + line_offset if exc.line is not None else None
        raise YamlError(exc.message, file=source, line=line) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 + line_offset if mark is not None else None
        what = exc.problem or exc.context or "malformed YAML"
        if (
            exc.problem
            and exc.context
            and exc.context_mark is not None
            and exc.context_mark.line + 1 + line_offset != line
        ):
            # Where it went wrong is often where the construct began (a bracket or a quote left open), not where the
            # parser noticed: both are said.
            what = f"{what} ({exc.context} started at line {exc.context_mark.line + 1 + line_offset})"
        raise YamlError(f"{what}; expected valid YAML", file=source, line=line) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1 + line_offset
        raise YamlError(
            f"character {_char_name(exc.character)} is not allowed in YAML text; remove it", file=source, line=line
        ) from None
    except yaml.YAMLError as exc:
        raise YamlError(f"malformed YAML: {exc}", file=source) from None
    except RecursionError:
        raise YamlError(f"nesting deeper than {MAX_DEPTH} levels", file=source) from None
    except Exception as exc:  # noqa: BLE001 - the last net: a hostile document is a problem, never a crash
        raise YamlError(f"cannot be read as YAML ({type(exc).__name__})", file=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, LineMap({k: v + line_offset for k, v in raw.items()})


def _char_name(ch: object) -> str:
    code = ch if isinstance(ch, int) else (ord(ch) if isinstance(ch, str) and len(ch) == 1 else None)
    return f"U+{code:04X}" if code is not None else repr(ch)


def decode(raw: bytes, *, source: str) -> str:
    """Decode UTF-8 strictly, with the line of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise YamlError("is not valid UTF-8; brain files must be UTF-8 text", file=source, line=line) from None


def split_frontmatter(text: str, *, source: str = "<string>") -> tuple[str, int, str]:
    """Split a Markdown file into (frontmatter YAML, line offset of the YAML, body).

    Raises :class:`YamlError` when the file does not open with a ``---`` frontmatter block.
    """
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise YamlError("has no YAML frontmatter; expected a first line '---'", file=source, line=1)
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            return "".join(lines[1:i]), 1, "".join(lines[i + 1 :])
    raise YamlError("frontmatter is not closed; expected a line '---' after it", file=source, line=1)


def dump_yaml(data: Any) -> str:
    """Dump data as block YAML in insertion order, without anchors, safe for :func:`parse_yaml`.

    Documents of plain keys, one-line strings, integers, booleans, nulls, nested mappings and lists of
    such scalars (every claim ambient writes) take a direct path, ten times faster than PyYAML's
    representer (bench/fanout.py writes one claim per item); anything else goes through PyYAML.
    """
    if isinstance(data, dict):
        lines: list[str] = []
        if _emit_mapping(data, "", lines, 0):
            return "\n".join(lines) + "\n" if lines else "{}\n"
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=120,
    )


# A plain scalar that every YAML 1.1 reader takes as this very string: starts with a letter, "_" or "/" (never a
# number, date, ".inf", "~", an indicator), then a few safe characters; the YAML 1.1 booleans are excluded.
_PLAIN_RE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@+-]*")
_NOT_PLAIN = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
_FAST_MAX_DEPTH = 8


def _scalar_text(value: Any) -> str | None:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if type(value) is str:
        if _PLAIN_RE.fullmatch(value) and value.lower() not in _NOT_PLAIN:
            return value
        if value.isprintable():  # no line break or control character: a JSON string is a YAML quoted scalar
            if value.isascii() and '"' not in value and "\\" not in value:
                return f'"{value}"'  # json.dumps' answer for such text, without building an encoder
            return json.dumps(value, ensure_ascii=False)
    return None  # floats, multi-line text, other types: PyYAML decides


def _emit_mapping(data: dict[Any, Any], indent: str, out: list[str], depth: int) -> bool:
    if depth > _FAST_MAX_DEPTH:
        return False
    for key, value in data.items():
        if type(key) is not str or not _PLAIN_RE.fullmatch(key) or key.lower() in _NOT_PLAIN:
            return False
        if isinstance(value, dict):
            if not value:
                out.append(f"{indent}{key}: {{}}")
            else:
                out.append(f"{indent}{key}:")
                if not _emit_mapping(value, indent + "  ", out, depth + 1):
                    return False
        elif isinstance(value, list):
            if not value:
                out.append(f"{indent}{key}: []")
                continue
            out.append(f"{indent}{key}:")
            for item in value:
                text = _scalar_text(item)
                if text is None:
                    return False
                out.append(f"{indent}- {text}")
        else:
            text = _scalar_text(value)
            if text is None:
                return False
            out.append(f"{indent}{key}: {text}")
    return True


def problems_from_validation(
    exc: ValidationError,
    *,
    file: str,
    lines: LineMap,
    model: type[BaseModel] | None = None,
    env: Mapping[str, tuple[str, ...]] | None = None,
) -> list[Problem]:
    """Turn pydantic errors into ``file:line: field: message`` problems.

    ``model``: the validated model, so that an unknown key is named with the key it looks like. ``env``: the
    ``AMBIENT_*`` variables in force and the setting each one sets: an error in a value one of them gave is that
    variable's (``$AMBIENT_CONCURRENCY: ...``), not the file's.
    """
    out: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        where = ".".join(str(p) for p in loc) or "(document)"
        msg = err["msg"]
        inp = err.get("input")
        got = ""
        if err["type"] not in ("missing",) and isinstance(inp, str | int | float | bool) and len(str(inp)) < 60:
            got = f" (got {inp!r})"
        line = lines.line_for(loc)
        if err["type"] == "missing" and loc and isinstance(inp, Mapping):
            typo = misspelled(str(loc[-1]), inp)
            if typo is not None:  # `spwan: deploy` beside a missing `spawn`: say so, at the misspelled key's line
                got = f" (is {typo!r} a misspelling of {loc[-1]!r}?)"
                line = lines.line_for((*loc[:-1], typo))
        if err["type"] == "extra_forbidden" and model is not None and loc:
            hint = unknown_key_hint(str(loc[-1]), known_keys(model, loc[:-1]))
            msg = f"unknown key; {hint}" if hint else "unknown key"
        elif err["type"] in MAPPING_EXPECTED:
            msg = mapping_expected(model, loc)
        var = next((v for v, path in (env or {}).items() if loc[: len(path)] == path), None)
        if var is not None:
            out.append(Problem(file=f"${var}", message=f"{where}: {msg}{got}"))
        else:
            out.append(Problem(file=file, line=line, message=f"{where}: {msg}{got}"))
    return out


#: pydantic's error types for a value that should have been a block of keys: their own words name the model's class
#: (``valid dictionary or instance of NotifySettings``), a name from the code the person never wrote.
MAPPING_EXPECTED = frozenset({"model_type", "model_attributes_type", "dataclass_type", "dict_type"})


def mapping_expected(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """What to say of a value that should have been a mapping, in the file's words: ``expected a mapping (key:
    value), e.g. notify: {urls: [...]}; its keys: urls, results, ...``, the keys ``model`` has at ``loc``."""
    found = _model_in(_annotation_at(model, loc)) if model is not None and loc else None
    keys = list(found.model_fields) if found is not None else []
    if found is None or not keys:
        return "expected a mapping (key: value)"
    first = found.model_fields[keys[0]].annotation
    listed = typing.get_origin(first) in (list, tuple, set, frozenset) or first in (list, tuple, set, frozenset)
    example = f"{loc[-1]}: {{{keys[0]}: {'[...]' if listed else '...'}}}"
    return f"expected a mapping (key: value), e.g. {example}; its keys: {', '.join(keys)}"


def unknown_key_hint(key: str, known: Sequence[str]) -> str:
    """What to say after ``unknown key``: the known key it looks like, else the keys there are ('' if none known).
    Every unknown key of a file ambient reads is said this way."""
    hint = did_you_mean(key, known, n=1, cutoff=0.75)
    if hint:
        return hint
    return f"the keys here: {', '.join(known)}" if known else ""


def known_keys(model: type[BaseModel], prefix: Sequence[str | int] = ()) -> list[str]:
    """The keys a model accepts at ``prefix`` (through nested models; [] where a free mapping is)."""
    found = _model_in(_annotation_at(model, prefix))
    return list(found.model_fields) if found is not None else []


def _annotation_at(model: type[BaseModel], prefix: Sequence[str | int]) -> Any:
    """The annotation of the field at ``prefix`` through nested models (the model itself at ``()``), else None."""
    current: Any = model
    for part in prefix:
        current = _model_in(current)
        if current is None or str(part) not in current.model_fields:
            return None
        current = current.model_fields[str(part)].annotation
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or the one model of a union (``ClusterSettings | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def misspelled(missing: str, mapping: Mapping[Any, Any]) -> str | None:
    """The key of ``mapping`` that looks like the ``missing`` one (a typo of a required key), if any."""
    keys = [k for k in mapping if isinstance(k, str) and k != missing]
    close = difflib.get_close_matches(missing, keys, n=1, cutoff=0.75)
    return close[0] if close else None


def expect_mapping(data: Any, *, source: str, what: str) -> Mapping[str, Any]:
    """Check that a document is a mapping, with a clear error otherwise."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise YamlError(f"{what} must be a YAML mapping (key: value), got {kind}", file=source, line=1)
    return data
