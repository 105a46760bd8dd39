"""One claim file (``claims/<sess_id>.yml``): the names it may have, reading it safely, the error of a bad one.

Reads never follow symlinks and cap the size; a malformed claim becomes a :class:`ClaimFileError` listing every
problem with its line (the store then reports and skips the file, never rewrites or deletes it). Shared by the
claim store and the claims census (:mod:`ambient.claims.index`), which both sit above it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import ValidationError

from ambient.claims.claim import Claim
from ambient.claims.names import SUFFIXES, is_claim_name
from ambient.core.errors import ClaimFileError, InputError, UnsafePathError
from ambient.core.problems import Problem
from ambient.storage.yamlfile import MAX_CLAIM_BYTES, expect_mapping, load_file, problems_from_validation

__all__ = ["SUFFIXES", "ClaimFileError", "is_claim_name", "read_claim_file"]


def read_claim_file(path: Path, rel: str) -> tuple[Claim, list[Problem], tuple[int, int, int]]:
    """Read one claim file (no symlink, size-capped): the claim, its warnings, and the (inode, size, mtime_ns)
    of the file read.

    ``rel`` names the file in problems. Raises :class:`ClaimFileError` (or InputError) with file and line when it
    cannot be used.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InputError("does not exist", file=rel) from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("is a symlink; ambient never follows symlinks in claims/ (ignored)", file=rel)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("is not a regular file (ignored)", file=rel)
    data, lines = load_file(path, max_bytes=MAX_CLAIM_BYTES, source=rel)
    doc = expect_mapping(data, source=rel, what="a claim")
    try:
        claim = Claim.model_validate(doc)
    except ValidationError as exc:
        raise ClaimFileError(problems_from_validation(exc, file=rel, lines=lines)) from None
    warnings = [
        Problem(file=rel, line=lines.line_for(loc), message=msg, severity="warning") for loc, msg in claim.warnings()
    ]
    return claim, warnings, (st.st_ino, st.st_size, st.st_mtime_ns)
