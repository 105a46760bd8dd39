"""YAML as text: the safe parser and the order-preserving dumper (pure; no files).

Hostile-input safe (RELIABILITY S-03): pure-Python SafeLoader only (the C loader segfaults on deep
nesting), aliases refused (no alias bombs), duplicate keys refused (PyYAML silently keeps the last
one), nesting bounded, and every error carries file and line. Timestamps stay strings, so a claim
rewritten by ambient keeps the user's ``opened_at: 2026-03-16T20:36`` text as it was.
:mod:`ambient.yamlfile` adds the capped, no-follow file reading.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ambient.errors import YamlError
from ambient.problems import Problem

MAX_DEPTH = 64
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


class _SafeLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    yaml.constructor.SafeConstructor,
    _Resolver,
):
    """Pure-Python safe loader that refuses aliases and bounds nesting."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self._depth = 0

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
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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


def parse_yaml(text: str, *, source: str = "<string>", line_offset: int = 0) -> tuple[Any, LineMap]:
    """Parse one YAML document safely; return the data and the line of every key.

    ``line_offset`` shifts reported lines (frontmatter starts after the ``---`` line).
    """
    loader: _SafeLoader | None = None
    try:
        loader = _SafeLoader(text)  # the reader refuses control characters here, before parsing
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
            typo = _misspelled(str(loc[-1]), inp)
            if typo is not None:  # `spwan: deploy` beside a missing `spawn`: say so, at the misspelled key's line
                got = f" (is {typo!r} a misspelling of {loc[-1]!r}?)"
                line = lines.line_for((*loc[:-1], typo))
        if err["type"] == "extra_forbidden" and model is not None and loc:
            known = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.75) if known else []
            msg = (
                f"unknown key; did you mean {close[0]!r}?"
                if close
                else f"unknown key; the keys here: {', '.join(known)}"
            )
        var = next((v for v, path in (env or {}).items() if loc[: len(path)] == path), None)
        if var is not None:
            out.append(Problem(file=f"${var}", message=f"{where}: {msg}{got}"))
        else:
            out.append(Problem(file=file, line=line, message=f"{where}: {msg}{got}"))
    return out


def _fields_at(model: type[BaseModel], prefix: tuple[str | int, ...]) -> list[str]:
    """The keys a model accepts at ``prefix`` (through nested models; [] where a free mapping is)."""
    current: Any = model
    for part in prefix:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or str(part) not in current.model_fields:
            return []
        current = current.model_fields[str(part)].annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _misspelled(missing: str, mapping: Mapping[Any, Any]) -> str | None:
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
