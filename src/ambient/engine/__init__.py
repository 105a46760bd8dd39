"""The engine: the TriggerEngine tick, workflow specs compiled to the planner's terms, the pure planner, run state
folded from the journal, the run executors (for_each, chain), theme branches, budgets and spend.
"""
