"""Agent text shown on a person's terminal: control, C1 and bidi characters are escaped, never emitted.

An agent is less trusted than the person who reads ``ambient status``: an error message with ``ESC ]0;...BEL`` or
``ESC [2J`` must not retitle or clear their terminal, and a right-to-left override must not reorder what they read
(Trojan Source). :func:`ambient.core.terminal.printable` escapes them visibly (``\\x1b``), like ``cat -v``; JSON output
is escaped by ``json`` itself.
"""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from ambient.core.terminal import printable, quoted
from ambient.service.logsetup import configure_logging
from tests.e2e.helpers import ambient_cli, command_agent_md, foreach_workflow, make_brain, running

#: What a terminal may act on: C0 controls but tab and newline, DEL, C1 controls, bidi and line separators.
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
HOSTILE = "boom \x1b[2J\x1b]0;owned\x07 \u202eevil\u202c \x9b31m \r overwritten \x00 end"


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    shown = printable(HOSTILE)
    assert UNSAFE.search(shown) is None
    assert shown == ("boom \\x1b[2J\\x1b]0;owned\\x07 \\u202eevil\\u202c \\x9b31m \\x0d overwritten \\x00 end")


def test_printable_keeps_plain_text_as_it_is() -> None:
    text = "déployé 10/10 ✓ 日本語 🚀\n\tindented line"
    assert printable(text) is text or printable(text) == text


@given(st.text())
def test_printable_never_lets_a_control_through(text: str) -> None:
    shown = printable(text)
    assert UNSAFE.search(shown) is None
    if UNSAFE.search(text) is None:
        assert shown == text  # nothing to escape: unchanged


@given(st.text())
def test_quoted_is_one_line_between_quotes_that_reads_back_as_the_text(text: str) -> None:
    shown = quoted(text)
    assert shown.startswith('"') and shown.endswith('"') and "\n" not in shown
    assert UNSAFE.search(shown) is None
    assert json.loads(shown) == text


def test_quoted_keeps_text_readable() -> None:
    assert quoted('Sure! "ok" déployé\x1b[2J\n') == '"Sure! \\"ok\\" déployé\\u001b[2J\\n"'


def test_console_logs_escape_agent_text() -> None:
    stream = io.StringIO()
    configure_logging("INFO", json=False, stream=stream)
    try:
        log = structlog.get_logger("t")
        log.warning("agent_said", error=HOSTILE)  # a value: the renderer's repr escapes it
        logging.getLogger("asyncio").error("a library's message: %s", HOSTILE)  # a message: written as it is
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            log.exception("agent_failed")  # a traceback: written as it is, lines kept
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    text = stream.getvalue()
    assert "agent_said" in text and "a library's message: boom \\x1b[2J" in text
    assert "ValueError: boom \\x1b[2J" in text and "Traceback" in text
    assert UNSAFE.search(text) is None, text


_HOSTILE_AGENT = (
    "import json, sys\n"
    "json.load(sys.stdin)\n"
    f"print(json.dumps({{'signal': 'ESCALATE', 'question': {HOSTILE!r}, 'options': ['retry', 'skip']}}))\n"
)
_FAILING_AGENT = (
    f"import json, sys\njson.load(sys.stdin)\nprint(json.dumps({{'status': 'failed', 'error': {HOSTILE!r}}}))\n"
)


def _agent_md(name: str, code: str) -> str:
    return command_agent_md(name, ["{{python}}", "-c", code])


@pytest.mark.slow
def test_cli_never_prints_an_agents_control_characters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = make_brain(
        tmp_path / "brain",
        agents={"asker": _agent_md("asker", _HOSTILE_AGENT), "failer": _agent_md("failer", _FAILING_AGENT)},
    )
    (paths.workflows / "ask.yml").write_text(foreach_workflow("ask", ["one"], agent="asker"))
    (paths.workflows / "fail.yml").write_text(foreach_workflow("fail", ["two"], agent="failer"))
    with running(paths, "--until-idle", ready=False) as daemon:
        assert daemon.wait(timeout=60) == 0
    shown = []
    commands = (
        ("status",),
        ("status", "fail"),
        ("status", "ask"),
        ("escalations",),
        ("runs",),
        ("thread", "asker"),
        ("thread", "failer"),
    )
    for args in commands:
        done = ambient_cli(paths.root, *args)
        assert done.returncode == 0, (args, done.stderr)
        shown.append((args, done.stdout + done.stderr))
    for args, text in shown:
        assert UNSAFE.search(text) is None, (args, text)  # nothing a terminal would act on ...
    assert "\\x1b]0;owned\\x07" in dict(shown)[("status", "fail")]  # ... the failure shown, escaped
    assert "\\u202eevil" in dict(shown)[("escalations",)]  # ... and the question
    # JSON keeps the value: the characters json leaves raw are written as JSON \u escapes (four hex digits).
    done = ambient_cli(paths.root, "escalations", "--json")
    assert done.returncode == 0, done.stderr
    assert UNSAFE.search(done.stdout) is None
    assert any(HOSTILE in text for text in _walk(json.loads(done.stdout)))  # the question, exactly as asked


def _walk(value: object) -> list[str]:
    """Every string in a JSON value."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in _walk(v)]
    if isinstance(value, list):
        return [s for v in value for s in _walk(v)]
    return [value] if isinstance(value, str) else []
