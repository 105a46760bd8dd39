"""The model keys of AI runners: which variable holds each one, and where it is read from.

A key is read from the daemon's environment, else from the file of the same name, lower-cased, in
``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``), so a key never has to sit in a unit file. Its value is
never printed: ``ambient doctor`` names the variable it found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ambient.core.errors import AmbientError
from ambient.storage.fsutil import read_capped

#: A key file larger than this is not a key.
MAX_KEY_BYTES = 64 * 1024

#: The variable (or credential file, lower-cased) of each ``llm`` provider's key, unless ``api_key_env`` says.
DEFAULT_KEY = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def credential(name: str, environ: Mapping[str, str]) -> str | None:
    """``name`` from ``environ``, else the file ``name.lower()`` in ``$CREDENTIALS_DIRECTORY`` (whitespace
    stripped); None when neither holds a value."""
    value = environ.get(name, "").strip()
    if value:
        return value
    creds = environ.get("CREDENTIALS_DIRECTORY")
    if creds:
        with contextlib.suppress(OSError, AmbientError):
            text = read_capped(Path(creds) / name.lower(), MAX_KEY_BYTES).decode("utf-8", "replace").strip()
            return text or None
    return None


def key_name(cfg: Any) -> str | None:
    """The variable holding the key of an ``llm`` runner; None when it needs none (an OpenAI-compatible local
    server at ``base_url`` without ``api_key_env``: Ollama, llama.cpp, vLLM take any key)."""
    if getattr(cfg, "kind", None) != "llm":
        return None
    if cfg.api_key_env:
        return str(cfg.api_key_env)
    if cfg.provider == "openai" and cfg.base_url:
        return None
    return DEFAULT_KEY[cfg.provider]
