"""Tests of ambient.cli."""
