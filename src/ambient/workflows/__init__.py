"""Workflow files (DESIGN 5): specs, exit-trigger actions, checks and ``{{name}}`` templating. Parses and validates
a spec; executes nothing and reads no file (loading ``workflows/*.yml`` is :mod:`ambient.config.workflows`).
"""
