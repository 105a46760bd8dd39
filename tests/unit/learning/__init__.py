"""Tests of ambient.learning.stats."""
