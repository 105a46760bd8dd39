"""Fixtures of the acceptance tests: a fresh brain from ``ambient init``, loopback stand-ins for the outside world."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.harness import Brain, FakeTelegram, Webhook


@pytest.fixture
def brain(tmp_path: Path) -> Brain:
    """``ambient init --no-example``: a brain with nothing in it but the commented configuration."""
    return Brain.init(tmp_path / "brain", "--no-example")


@pytest.fixture
def example_brain(tmp_path: Path) -> Brain:
    """``ambient init``: the brain a newcomer starts from (an example agent and workflow)."""
    return Brain.init(tmp_path / "brain")


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    """An apprise ``json://`` endpoint on 127.0.0.1 that records every notification."""
    with Webhook() as hook:
        yield hook


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    """A fake Telegram Bot API on 127.0.0.1."""
    with FakeTelegram() as bot:
        yield bot
