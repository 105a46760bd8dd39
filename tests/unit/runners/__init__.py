"""Tests of ambient.runners."""
