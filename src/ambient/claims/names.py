"""Which names in ``claims/`` are claim files: apart from :mod:`ambient.claims.claimfile` (which validates them with
the claim model) so that a count of claim files (``ambient status``'s first look) imports no model."""

from __future__ import annotations

from typing import Final

SUFFIXES: Final = (".yml", ".yaml")


def is_claim_name(name: str) -> bool:
    """Is ``name`` (in ``claims/``) a claim file's? Hidden names are temp files, other suffixes not claims."""
    return not name.startswith(".") and name.endswith(SUFFIXES)
