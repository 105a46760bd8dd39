"""Workflow files (DESIGN 5): specs, exit-trigger actions, checks, ``{{name}}`` templating and loading from disk.
Parses and validates; executes nothing.
"""
