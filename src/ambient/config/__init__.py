"""Configuration: ambient's settings, a brain loaded into one read-only snapshot (agents, matrix, runners, workflow
files), and what ``ambient init`` writes.

Loading ``workflows/*.yml`` lives here, above the engine, because a workflow file is also checked against the
engine's own routing rules (:func:`ambient.engine.compile.workflow_issues`) before it is accepted.
"""
