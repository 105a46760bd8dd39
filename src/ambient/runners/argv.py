"""A command agent's argv rendered from its ``{{name}}`` templates (DESIGN §5, S-07). Pure.

Plain substitution, one value per argv element, no expressions and no shell: whatever a value holds (spaces,
quotes, ``;``, ``$(...)``, newlines, ``{{x}}``) it stays exactly one argument, and a value that would read as an
option is refused. The runner config (:mod:`ambient.runners.runner_config`) checks the templates when an agent is
loaded; the command runner renders them per SPAWN with the request's values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ambient.core.errors import SpawnTemplateError

#: Linux MAX_ARG_STRLEN is 128 KiB including the NUL; one rendered argv element must fit.
MAX_ARG_BYTES = 128 * 1024 - 1

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: The only template allowed in argv[0]: the daemon's own interpreter (never workflow data).
PROGRAM_TEMPLATES = frozenset({"python"})


def check_argv(argv: list[str]) -> list[str]:
    """An agent's argv templates as its runner config gives them; raises ValueError on a NUL, a stray brace or a
    program (argv[0]) that is empty or comes from anything but the daemon's interpreter."""
    for index, element in enumerate(argv):
        if "\x00" in element:
            msg = f"argv[{index}] contains a NUL byte"
            raise ValueError(msg)
        names = template_names(element)
        if index == 0:
            if not element.strip():
                msg = "argv[0] (the program) is empty"
                raise ValueError(msg)
            # The program itself never comes from workflow data; only the daemon's interpreter may be named.
            if names and not (_PLACEHOLDER.fullmatch(element) and names[0] in PROGRAM_TEMPLATES):
                msg = "argv[0] (the program) may only be a fixed path or exactly '{{python}}'"
                raise ValueError(msg)
    return argv


def template_names(text: str) -> list[str]:
    """Names used by ``{{name}}`` placeholders in ``text``; raises ValueError on a stray ``{{`` or ``}}``."""
    names = _PLACEHOLDER.findall(text)
    rest = _PLACEHOLDER.sub("", text)
    if "{{" in rest or "}}" in rest:
        msg = f"{text!r} has a '{{{{' or '}}}}' that is not a placeholder; expected {{{{name}}}} with a plain name"
        raise ValueError(msg)
    return names


def render_arg(template: str, values: Mapping[str, str], *, index: int = 0) -> str:
    """Render one argv element: each ``{{name}}`` is replaced by ``values[name]`` in a single pass.

    A value is never parsed again, so a value containing ``{{x}}`` stays literal. The result is exactly one
    argv element whatever the value holds (spaces, quotes, ``;``, ``$(...)``, newlines): no shell ever sees it.
    """

    def _one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            known = ", ".join(sorted(values)) or "none"
            msg = f"argv[{index}]: unknown template name {{{{{name}}}}}; known names: {known}"
            raise SpawnTemplateError(msg)
        value = values[name]
        if not isinstance(value, str):
            msg = f"argv[{index}]: value of {{{{{name}}}}} is {type(value).__name__}; expected a string"
            raise SpawnTemplateError(msg)
        return value

    out = _PLACEHOLDER.sub(_one, template)
    if "\x00" in out:
        msg = f"argv[{index}]: rendered argument contains a NUL byte; a NUL cannot be passed to a program"
        raise SpawnTemplateError(msg)
    if len(out.encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES:
        msg = f"argv[{index}]: rendered argument is over {MAX_ARG_BYTES} bytes"
        raise SpawnTemplateError(msg)
    return out


def render_argv(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Render every element of ``argv`` (see :func:`render_arg`) and refuse option smuggling.

    S-07: an element that *starts* with a placeholder and renders to text beginning with ``-`` would be read as
    an option by the program (``--output=/etc/x``, ``-rf``). It is refused unless a literal ``--`` element comes
    before it in ``argv`` (the end-of-options marker of most tools). Elements such as ``--item={{item}}`` are
    safe: the program reads the whole element as that one option.
    """
    out: list[str] = []
    after_dashdash = False
    for index, template in enumerate(argv):
        rendered = render_arg(template, values, index=index)
        starts_with_value = _PLACEHOLDER.match(template) is not None
        if starts_with_value and rendered.startswith("-") and not after_dashdash and index > 0:
            msg = (
                f"argv[{index}]: templated value {rendered[:40]!r} starts with '-' and would be read as an option; "
                "put a literal '--' element before it in argv (for tools that accept it) or prefix the template"
            )
            raise SpawnTemplateError(msg)
        if template == "--":
            after_dashdash = True
        out.append(rendered)
    return out
