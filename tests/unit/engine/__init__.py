"""Tests of ambient.engine.tick."""
