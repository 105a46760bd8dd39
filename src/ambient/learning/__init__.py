"""The learning loop (ADR-027): statistics over run records, learned rules and their store, replay of recorded runs
through the engine's own rules.
"""
