"""Tests of ambient.live."""
