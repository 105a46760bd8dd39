"""The learning loop (ADR-027): what the engine's run records teach. Pure modules over the records, one shell module.

- :mod:`~ambient.learning.stats`: statistics over run records (outcomes, escalation rate by week, cost, errors).
- :mod:`~ambient.learning.rules`: learned rules as data: situations, shadow → active → opt-in, never alone.
- :mod:`~ambient.learning.replay`: recorded runs through a workflow as it is now, decided by the engine's own rules.
- :mod:`~ambient.learning.rulestore`: ``.ambient/rules.yml``, the only I/O of the package.
"""
