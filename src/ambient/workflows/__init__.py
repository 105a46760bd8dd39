"""Workflow files (DESIGN 5): parse and validate a spec, decide when it starts; execute nothing, read no file.

``spec`` the models of both forms (for_each, chain) · ``exit_actions`` exit-trigger actions, parsed from every
spelling · ``fields`` the small value types both are written with (names, durations, scope paths) · ``checks`` the
findings beyond the schema · ``variables`` which ``{{name}}`` each place may use, and their values · ``templating``
the substitution itself · ``triggers`` when a workflow starts a run by itself. Loading ``workflows/*.yml`` from disk is
:mod:`ambient.config.workflows`.
"""
