"""Tests of ambient.claims.claim."""
