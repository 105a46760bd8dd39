"""Logging set-up: JSON lines off a TTY, stdlib records formatted too, secrets masked last (§2.2, S-06)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from ambient.core.redact import SecretRegistry
from ambient.service.logsetup import configure_logging
from tests.conftest import logging_restored

CANARY = "987654321:AAFcanaryTOKENcanaryTOKEN0123456789ab"
OPAQUE = "opaque-canary-secret-value"  # no token shape: only the registry can catch it


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    with logging_restored():
        yield


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_when_not_a_tty() -> None:
    """Off a terminal every line is a JSON object with event, level, logger and an ISO UTC timestamp."""
    stream = io.StringIO()
    configure_logging("INFO", None, SecretRegistry(), stream=stream)
    structlog.get_logger("ambient.test").info("run_started", run_id="r1", items=3)
    (line,) = _lines(stream)
    assert line["event"] == "run_started" and line["run_id"] == "r1" and line["items"] == 3
    assert line["level"] == "info" and line["logger"] == "ambient.test"
    assert str(line["timestamp"]).endswith("Z")


def test_console_on_a_tty() -> None:
    """On a terminal the console renderer is used (not JSON)."""
    stream = _Tty()
    configure_logging("INFO", None, stream=stream)
    structlog.get_logger("ambient.test").info("hello_console", k="v")
    text = stream.getvalue()
    assert "hello_console" in text and "k=v" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_contextvars_are_merged() -> None:
    """Values bound with bound_contextvars appear on every line inside the block."""
    stream = io.StringIO()
    configure_logging("INFO", True, stream=stream)
    with structlog.contextvars.bound_contextvars(workflow="wf", run_id="r9", item="a.md"):
        structlog.get_logger("ambient.test").info("item_done")
    (line,) = _lines(stream)
    assert (line["workflow"], line["run_id"], line["item"]) == ("wf", "r9", "a.md")


def test_canary_redacted_in_event_values() -> None:
    """A token and a registered secret in the event and its fields never reach the output."""
    stream = io.StringIO()
    configure_logging("DEBUG", True, SecretRegistry([OPAQUE]), stream=stream)
    log = structlog.get_logger("ambient.test")
    log.info(f"sending {CANARY}", url=f"tgram://{CANARY}/42", nested={"k": [OPAQUE]}, plain=OPAQUE)
    log.debug("opaque %s", OPAQUE)
    out = stream.getvalue()
    assert "sending" in out and "tgram://" in out
    assert CANARY not in out and OPAQUE not in out and "AAFcanary" not in out


def test_canary_redacted_in_tracebacks() -> None:
    """An exception message carrying a secret is rendered, then redacted."""
    stream = io.StringIO()
    configure_logging("INFO", True, SecretRegistry([OPAQUE]), stream=stream)
    try:
        raise RuntimeError(f"cannot reach https://api.telegram.org/bot{CANARY}/getMe with {OPAQUE}")
    except RuntimeError:
        structlog.get_logger("ambient.test").exception("send_failed")
    (line,) = _lines(stream)
    assert "RuntimeError" in str(line["exception"])
    assert CANARY not in stream.getvalue() and OPAQUE not in stream.getvalue()


def test_stdlib_apprise_records_are_formatted_and_redacted() -> None:
    """apprise's own stdlib warnings become JSON lines with the token masked."""
    stream = io.StringIO()
    configure_logging("DEBUG", True, SecretRegistry([OPAQUE]), stream=stream)
    logging.getLogger("apprise").warning("Telegram POST URL: http://x/bot%s/sendMessage (%s)", CANARY, OPAQUE)
    (line,) = _lines(stream)
    assert line["logger"] == "apprise" and line["level"] == "warning"
    assert "sendMessage" in str(line["event"])
    assert CANARY not in stream.getvalue() and OPAQUE not in stream.getvalue()


def test_apprise_logger_stays_at_warning() -> None:
    """Even at DEBUG the apprise logger is WARNING, and its DEBUG lines are dropped if its level is lowered."""
    stream = io.StringIO()
    configure_logging("DEBUG", True, stream=stream)
    assert logging.getLogger("apprise").level == logging.WARNING
    assert logging.getLogger("httpx").level == logging.WARNING
    logging.getLogger("apprise").debug("Telegram POST URL: bot%s", CANARY)
    logging.getLogger("apprise").setLevel(logging.DEBUG)  # as apprise's LogCapture may do
    logging.getLogger("apprise").debug("Telegram Payload: %s", OPAQUE)
    logging.getLogger("httpx.client").info("HTTP Request: POST %s", OPAQUE)
    assert stream.getvalue() == ""


def test_apprise_logger_follows_a_higher_level() -> None:
    """At ERROR the quiet loggers are at ERROR too, not lowered to WARNING."""
    configure_logging("ERROR", True, stream=io.StringIO())
    assert logging.getLogger("apprise").level == logging.ERROR


def test_reconfigure_replaces_the_handler() -> None:
    """Configuring twice leaves one ambient handler, writing to the new stream."""
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", True, stream=first)
    configure_logging("INFO", True, stream=second)
    logging.getLogger("ambient.other").warning("once")
    assert first.getvalue() == "" and len(_lines(second)) == 1


def test_bad_level_is_refused() -> None:
    """An unknown level name is a clear error."""
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("LOUD", True, stream=io.StringIO())


def test_filtered_levels_are_not_emitted() -> None:
    """At INFO, structlog debug events are not emitted."""
    stream = io.StringIO()
    configure_logging("INFO", True, stream=stream)
    structlog.get_logger("ambient.test").debug("noise")
    assert stream.getvalue() == ""
