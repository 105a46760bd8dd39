"""Tests of ambient.kernel."""
