"""Who acts and how long things took, in the words every door (CLI, console) prints."""

from __future__ import annotations

import os


def os_user() -> str:
    """The person acting, as every door records it (``by``): ``$USER``, else ``human`` (a service or a console
    started without a login has no name to give; the account it runs as is not the person)."""
    return os.environ.get("USER") or "human"


def short_duration(seconds: float) -> str:
    """``42s``, ``3m``, ``2h05m``, ``4d3h``: a latency as the CLI and the console show it."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"
