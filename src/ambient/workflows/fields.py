"""The small value types a workflow file is written with: names, durations, scope paths and templates.

Shared by the exit-trigger actions (:mod:`ambient.workflows.exit_actions`) and the specs
(:mod:`ambient.workflows.spec`), so that a step name or an agent name is the same rule wherever it is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from ambient.core.errors import InputError, WorkflowTemplateError
from ambient.kernel.zones import normalize
from ambient.workflows import templating

SatelliteType = Literal["code", "brain-write", "test", "deploy", "search", "domain"]
SATELLITE_TYPES: Final[tuple[str, ...]] = ("code", "brain-write", "test", "deploy", "search", "domain")

WORKFLOW_NAME_RE = re.compile(r"(?!\.)[^\s/\\:\x00-\x1f\x7f]{1,128}")
NUMBER_RE = re.compile(r"[0-9]{1,9}")
_IDENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
STEP_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
SIGNAL_RE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
#: Step names that mean "go on" in a trigger (trigger:next), so no step may bear them.
RESERVED_STEPS = frozenset({"next", "next_item", "next-item"})


def custom_error(kind: str, message: str) -> PydanticCustomError:
    """A validation error with our own message: pydantic reports it at its key path, which the shell maps to a line."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def check_ident(value: str, what: str = "name") -> str:
    """``value`` if it is a plain name (an agent, a principal, an option): it names files and claims."""
    if not _IDENT_RE.fullmatch(value):
        raise custom_error(
            "bad_name",
            f"{value!r} is not a valid {what}; expected letters, digits, '_', '.', '-' (no spaces or '/')",
        )
    return value


def _agent_name(value: str) -> str:
    return check_ident(value, "agent name")


def _principal(value: str) -> str:
    return check_ident(value, "principal name")


AgentName = Annotated[str, AfterValidator(_agent_name)]
Principal = Annotated[str, AfterValidator(_principal)]

_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``2.5``, ``"90s"``, ``"30m"``, ``"1h30m"``, ``"500ms"``, ``"2d"``."""
    if isinstance(value, bool):
        raise custom_error("duration", "expected a duration such as 30s, 5m, 1h30m or a number of seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return float(text)
        pos, total = 0, 0.0
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None:
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise custom_error(
        "duration", f"{value!r} is not a duration; expected e.g. 30s, 5m, 1h30m, 500ms, 2d or a number of seconds"
    )


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=365 * 86400)]


def check_scope_text(value: str, error: Callable[[str], Exception]) -> str:
    """A scope path or path template: templates are checked for syntax, literal paths normalised."""
    if not value.strip():
        raise error("a scope path may not be empty")
    if templating.has_variables(value):
        try:
            templating.variables(value)
        except WorkflowTemplateError as exc:
            raise error(exc.message) from None
        return value
    try:
        return normalize(value) or value
    except InputError as exc:
        raise error(exc.message) from None


def _scope_field(value: str) -> str:
    return check_scope_text(value, lambda why: custom_error("scope", why))


def _template_field(value: str) -> str:
    try:
        templating.variables(value)
    except WorkflowTemplateError as exc:
        raise custom_error("template", exc.message) from None
    return value


ScopePath = Annotated[str, AfterValidator(_scope_field)]
TemplateText = Annotated[str, AfterValidator(_template_field)]
