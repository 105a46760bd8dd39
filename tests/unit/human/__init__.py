"""Tests of ambient.human."""
