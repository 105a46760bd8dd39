"""Tests of ambient.workflows."""
