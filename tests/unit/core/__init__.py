"""Tests of ambient.core."""
