"""Tests of ambient.service."""
