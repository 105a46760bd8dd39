"""The tool calls a person allowed an AI agent for good (``allow always``) and the command patterns they accepted
(``allow-pattern``, listed as ``Bash pattern: pytest -q tests/*``): listed and forgotten by ``ambient grants`` and the
console's matrix page through these functions. A forgotten call is a question again from the agent's next call; a
forgotten pattern takes with it the commands it was offered from, so it is offered again only after as many new
ones. The grants live in ``.ambient/claude/grants.json`` (:class:`ambient.runners.claude.SessionStore`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ambient.core.errors import NoSuchGrantError

if TYPE_CHECKING:
    from ambient.runners.claude import SessionStore
    from ambient.storage.paths import BrainPaths

#: What ``ambient grants`` says when there is none.
NO_GRANTS = "no grants: every call outside an agent's allowed_tools is asked (allow | allow-always | deny)"


@dataclass(frozen=True)
class Forgotten:
    """Grants dropped: how many, of which agent, and the line a person reads."""

    agent: str
    dropped: int

    @property
    def message(self) -> str:
        return f"forgot {self.dropped} grant(s) of {self.agent}: asked again from the next call"


def _store(paths: BrainPaths) -> SessionStore:
    from ambient.runners.claude import SessionStore  # here: `ambient grants` starts fast

    return SessionStore(paths.state / "claude")


def list_grants(paths: BrainPaths) -> dict[str, list[str]]:
    """Agent → the calls allowed for good and the patterns accepted, as the person reads them."""
    return _store(paths).all_grants()


def forget_grant(paths: BrainPaths, agent: str, call: str | None = None) -> Forgotten:
    """Forget ``call`` of ``agent`` (as listed, its sha256, or a pattern alone; every grant of it when None).
    Raises :class:`NoSuchGrantError` if none."""
    dropped = _store(paths).forget(agent, call)
    if not dropped:
        raise NoSuchGrantError(f"no such grant of {agent}; `ambient grants` lists them")
    return Forgotten(agent, dropped)
