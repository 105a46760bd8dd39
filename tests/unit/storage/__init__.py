"""Tests of ambient.storage."""
