"""The daemon's secrets by what the settings read: which variables, and their leaving ``os.environ``."""

from __future__ import annotations

import os

import pytest

from ambient.runners.runner_config import parse_runner_config
from ambient.service.envblock import forget, secret_names


def test_a_key_named_by_api_key_env_is_a_secret_whatever_its_name() -> None:
    """``GROQ_KEY`` says nothing of a key by its name: it is one because an agent's runner reads it."""
    runners = {
        "groq": parse_runner_config({"kind": "llm", "provider": "openai", "api_key_env": "GROQ_KEY"}),
        "tool": parse_runner_config({"kind": "command", "argv": ["true"], "env": {"MODE": "x"}}),
    }
    environ = {"GROQ_KEY": "k", "OPENAI_API_KEY": "o", "GITHUB_TOKEN": "t", "PATH": "/bin", "MODE": "x"}
    assert secret_names(runners, environ) == {"GROQ_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN"}
    assert secret_names({}, environ) == {"OPENAI_API_KEY", "GITHUB_TOKEN"}  # unnamed by a runner: by its name only


def test_forget_removes_the_names_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMBIENT_TEST_GROQ_KEY", "secret-value")
    monkeypatch.setenv("AMBIENT_TEST_KEPT", "plain")
    forget(["AMBIENT_TEST_GROQ_KEY"])
    assert "AMBIENT_TEST_GROQ_KEY" not in os.environ and os.environ["AMBIENT_TEST_KEPT"] == "plain"
