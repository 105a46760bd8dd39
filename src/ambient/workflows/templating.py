"""``{{name}}`` substitution from a given mapping only: no expressions, no code, no second pass (DESIGN 5).

Paths rendered here are normalised by :func:`ambient.kernel.zones.normalize` and refused when they would
leave the brain root (RELIABILITY S-01); argv elements are rendered one value each (S-07). Which names each
place of a workflow may use, and their values, is :mod:`ambient.workflows.variables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from ambient.core.errors import UnsafePathError, WorkflowTemplateError
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, normalize, zone_of

# A variable is a dotted name: a root (item, total, prior...) then fields or list indexes.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*"
_VAR_RE = re.compile(r"\{\{\s*(" + _NAME + r")\s*\}\}")
_OPEN = "{{"
_CLOSE = "}}"
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_RENDERED = 64 * 1024  # a rendered string longer than this is refused (a runaway value)


@lru_cache(maxsize=1024)  # pure; the same few templates are rendered for every item of a fan-out
def _scan(template: str) -> tuple[tuple[int, int, str], ...]:
    """Every ``{{name}}`` of ``template`` as (start, end, name); malformed braces raise."""
    return tuple(_scan_uncached(template))


def _scan_uncached(template: str) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    pos = 0
    while True:
        start = template.find(_OPEN, pos)
        if start < 0:
            return out
        m = _VAR_RE.match(template, start)
        if m is None:
            end = template.find(_CLOSE, start + 2)
            if end < 0:
                raise WorkflowTemplateError(f"unclosed '{{{{' in template {template!r}; expected {{{{name}}}}")
            inner = template[start + 2 : end].strip()
            raise WorkflowTemplateError(
                f"{{{{{inner}}}}} in template {template!r} is not a variable name; templates substitute "
                "names such as {{item}} or {{prior.result.status}}, they never evaluate expressions"
            )
        out.append((m.start(), m.end(), m.group(1)))
        pos = m.end()


def variables(template: str) -> frozenset[str]:
    """The dotted names a template refers to (``{{prior.result.status}}`` gives ``prior.result.status``)."""
    return frozenset(name for _, _, name in _scan(template))


def roots(template: str) -> frozenset[str]:
    """The root variables a template refers to (``prior`` for ``{{prior.result.status}}``)."""
    return frozenset(name.split(".", 1)[0] for name in variables(template))


def has_variables(template: str) -> bool:
    """True when the string contains ``{{``: it is a template, not a literal."""
    return _OPEN in template


def _format(value: Any, name: str, template: str) -> str:
    # bool before int: bool is an int subclass; YAML spells them true/false.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if value is None:
        raise WorkflowTemplateError(f"variable {name!r} in template {template!r} has no value (null)")
    kind = "a mapping" if isinstance(value, Mapping) else "a list" if isinstance(value, list | tuple) else "not text"
    raise WorkflowTemplateError(
        f"variable {name!r} in template {template!r} is {kind}; name one of its fields, e.g. {{{{{name}.status}}}}"
    )


def lookup(name: str, values: Mapping[str, Any], *, template: str = "") -> Any:
    """Resolve a dotted name in plain data: mapping keys, and list indexes written as digits."""
    first, *rest = name.split(".")
    if first not in values:
        known = ", ".join(sorted(values)) or "none"
        raise WorkflowTemplateError(f"unknown template variable {first!r} in {template!r}; known variables: {known}")
    node: Any = values[first]
    walked = first
    for part in rest:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list | tuple) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise WorkflowTemplateError(f"{walked!r} has no field {part!r} (template {template!r})")
        walked = f"{walked}.{part}"
    return node


def render(template: str, values: Mapping[str, Any]) -> str:
    """Substitute every ``{{name}}`` from ``values``; substituted text is never scanned again."""
    if not isinstance(template, str):
        raise WorkflowTemplateError(f"a template must be text, got {type(template).__name__}")
    return _substitute(template, _scan(template), values)


def _substitute(
    template: str,
    spans: Sequence[tuple[int, int, str]],
    values: Mapping[str, Any],
    check: Callable[[str, str, str], None] | None = None,
) -> str:
    if not spans:
        return template
    parts: list[str] = []
    pos = 0
    for start, end, name in spans:
        text = _format(lookup(name, values, template=template), name, template)
        if check is not None:
            check(text, name, template)
        parts.append(template[pos:start])
        parts.append(text)
        pos = end
    parts.append(template[pos:])
    out = "".join(parts)
    if len(out) > MAX_RENDERED:
        raise WorkflowTemplateError(
            f"template {template!r} renders to {len(out)} characters; the limit is {MAX_RENDERED}"
        )
    return out


def render_value(value: Any, values: Mapping[str, Any]) -> Any:
    """Render every string inside plain data (mappings, lists); keys and non-strings are kept as they are."""
    if isinstance(value, str):
        return render(value, values)
    if isinstance(value, Mapping):
        return {k: render_value(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render_value(v, values) for v in value]
    return value


class RenderedPath(NamedTuple):
    """A rendered brain-relative path (normalised; a trailing ``/`` marks a folder) and its zone."""

    path: str
    zone: str


def _check_component(value: str, name: str, template: str) -> None:
    # A value fills one path component: it can never add structure ("a/b", "..") to the path (S-01).
    if value in ("", ".", ".."):
        raise UnsafePathError(
            f"variable {name!r} is {value!r} in path template {template!r}; expected a file or folder name"
        )
    if "/" in value or "\\" in value:
        raise UnsafePathError(
            f"variable {name!r} is {value!r} in path template {template!r}; a value fills one path component "
            "and may not contain '/' or '\\'"
        )
    if _CONTROL_RE.search(value):
        raise UnsafePathError(f"variable {name!r} in path template {template!r} contains a control character")
    if len(value.encode()) > 255:
        raise UnsafePathError(f"variable {name!r} in path template {template!r} is longer than 255 bytes")


def render_path(
    template: str,
    values: Mapping[str, Any],
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
) -> RenderedPath:
    """Render a brain-relative path template, refusing anything that could leave the brain root (S-01).

    Each substituted value must be a single path component (no ``/``, ``\\``, ``..``, control
    characters, at most 255 bytes). The result is then normalised by :func:`ambient.kernel.zones.normalize`,
    which refuses absolute paths, ``..``, backslashes, NUL and over-long components. Percent
    sequences (``%2e%2e``) are literal characters: nothing is URL-decoded. Symlinks are the shell's
    business (:func:`ambient.storage.fsutil.resolve_in_brain`).
    """
    if not isinstance(template, str):
        raise WorkflowTemplateError(f"a path template must be text, got {type(template).__name__}")
    rendered = _substitute(template, _scan(template), values, _check_component)
    if _CONTROL_RE.search(rendered):
        raise UnsafePathError(f"path {rendered!r} (from {template!r}) contains a control character")
    clean = normalize(rendered)
    if clean in ("", "/"):
        raise UnsafePathError(f"path template {template!r} renders to the brain root; expected a file or folder")
    return RenderedPath(clean, zone_of(clean, zone_rules))


def render_argv(
    argv: Sequence[str],
    values: Mapping[str, Any],
    *,
    reject_option_values: bool = False,
) -> list[str]:
    """Render each argv element on its own: one value stays one element, never joined or split (S-07).

    A NUL byte is refused (it cannot be passed to exec). With ``reject_option_values``, an element
    that starts with ``-`` only because of a substituted value (``{{item}}`` = ``-rf``) is refused,
    for tools that do not accept ``--`` before their arguments.
    """
    out: list[str] = []
    for element in argv:
        rendered = render(element, values)
        if "\x00" in rendered:
            raise WorkflowTemplateError(f"argument {element!r} renders to text with a NUL byte; expected plain text")
        if reject_option_values and rendered.startswith("-") and not element.startswith("-"):
            raise WorkflowTemplateError(
                f"argument {element!r} renders to {rendered!r}, which a tool would read as an option; "
                "expected a value that does not start with '-'"
            )
        out.append(rendered)
    return out
