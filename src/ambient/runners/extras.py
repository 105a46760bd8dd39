"""Which optional extra an AI runner needs, and whether it is installed (``ambient[claude]``, ``ambient[llm]``).

Checked with :func:`importlib.util.find_spec`, which finds a package without importing it: ``ambient validate`` on a
brain of 56 Claude agents does not pay for importing the SDK.
"""

from __future__ import annotations

import importlib.util
from typing import Any

#: kind (and provider) → (module to find, extra to install).
_NEEDS: dict[str, tuple[str, str]] = {
    "claude": ("claude_agent_sdk", "claude"),
    "llm:anthropic": ("anthropic", "llm"),
    "llm:openai": ("openai", "llm"),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(cfg: Any) -> str | None:
    """What to install for this runner config, said for a person; None when nothing is missing."""
    kind = getattr(cfg, "kind", None)
    key = f"llm:{cfg.provider}" if kind == "llm" else str(kind)
    need = _NEEDS.get(key)
    if need is None or installed(need[0]):
        return None
    module, extra = need
    what = "kind: claude" if kind == "claude" else f"kind: llm with provider {cfg.provider}"
    return f"{what} needs the {module} package, which is not installed: pip install 'ambient[{extra}]'"
