"""Tests of ambient.testing."""
