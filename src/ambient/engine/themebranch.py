"""Theme branches (spec/002 v1.8, spec/004 steps 2 and 12) for a brain that is a git repository.

Open the branch at the start of a chain, merge it at the end when every step is green. A merge
conflict is reported (the chain signals BLOCKED_ON), never forced: the merge is aborted and the
work stays on the branch. Without git, the field is reported and ignored. git runs as argv, no shell.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from ambient.core.lazylog import get_logger

log = get_logger(__name__)


class GitBranches:
    """Open and merge theme branches in the brain's repository."""

    def __init__(self, root: Path, base: str | None = None) -> None:
        self.root = root
        self.base = base

    async def _git(self, *args: str) -> tuple[int, str]:
        git = shutil.which("git")
        if git is None:
            return 127, "git is not installed"
        proc = await asyncio.create_subprocess_exec(  # fixed argv, no shell
            git,
            "-C",
            str(self.root),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace").strip()

    async def is_repo(self) -> bool:
        code, _ = await self._git("rev-parse", "--is-inside-work-tree")
        return code == 0

    async def current(self) -> str | None:
        code, out = await self._git("rev-parse", "--abbrev-ref", "HEAD")
        return out if code == 0 else None

    async def open(self, branch: str) -> str | None:
        """Switch to ``branch`` (created from the current one if new); a problem text, or None."""
        if not await self.is_repo():
            return f"{self.root} is not a git repository: theme branch {branch!r} ignored"
        current = await self.current()
        if current == branch:
            return None
        self.base = self.base or current
        code, _ = await self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        args = ("switch", branch) if code == 0 else ("switch", "-c", branch)
        code, out = await self._git(*args)
        if code != 0:
            return f"cannot switch to {branch}: {out[-300:]}"
        log.info("theme_branch_opened", branch=branch, base=self.base)
        return None

    async def merge(self, branch: str) -> str | None:
        """Merge ``branch`` into its base (``--no-ff``); on conflict abort the merge and say so."""
        if not await self.is_repo():
            return None
        base = self.base or "main"
        code, out = await self._git("switch", base)
        if code != 0:
            return f"cannot switch to {base}: {out[-300:]}"
        ident: tuple[str, ...] = ()
        code, email = await self._git("config", "user.email")
        if code != 0 or not email:
            # A service account often has no git identity: sign the merge as ambient rather than fail.
            ident = ("-c", "user.name=ambient", "-c", "user.email=ambient@localhost")
        code, out = await self._git(*ident, "merge", "--no-ff", "--no-edit", branch)
        if code != 0:
            await self._git("merge", "--abort")
            await self._git("switch", branch)
            return f"merging {branch} into {base} conflicts; resolve it by hand (merge aborted): {out[-300:]}"
        log.info("theme_branch_merged", branch=branch, base=base)
        return None
