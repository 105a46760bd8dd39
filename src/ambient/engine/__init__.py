"""The engine: the TriggerEngine tick (``tick``), workflow specs compiled to the planner's terms (``compile``), the pure
planner (``planner``), the run journal's events (``events``) and the run state folded from them (``runstate``), the
executors' ports (``ports``), what every run shares (``runs``), the for_each and chain executors (``foreach``,
``chain``), the runs of the daemon started and resumed (``manager``), run journals as files (``journals``), theme
branches (``themebranch``), budgets and spend (``budget``, ``spend``), run records (``records``) and the daemon-wide
agent slots (``slots``).
"""
