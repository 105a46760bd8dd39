"""Workflow files (DESIGN 5): specs, exit-trigger actions, checks, ``{{name}}`` templating, loading from disk, and
when a workflow starts a run by itself (``triggers``). Parses, validates and decides; executes nothing.
"""
