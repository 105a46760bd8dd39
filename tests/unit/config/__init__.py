"""Tests of ambient.config."""
