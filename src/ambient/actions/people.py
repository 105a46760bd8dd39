"""Who acts and how long things took, in the words every door (CLI, console) prints."""

from __future__ import annotations

import os
import pwd


def os_user() -> str:
    """The person acting: ``$USER``, else the account running this process, else ``human``."""
    name = os.environ.get("USER")
    if name:
        return name
    try:
        return pwd.getpwuid(os.getuid()).pw_name or "human"
    except KeyError:
        return "human"


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
