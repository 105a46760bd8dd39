"""The daemon as a service: the composition root (``daemon``: wiring, start-up, main loop, staged shutdown, one
instance per brain in ``instance``), the real adapters of the engine's ports (``adapters``: the agent delegate and
the emitter, with ``leases``; ``escalator``; ``claims_writer``), the tick's evaluators (``evaluators``; ``digest``
and ``heap`` hold their own), how runs start (``starts``) and what ambient does with packets sent to it
(``packets``), the live threads' turns (``live_turns``), notifications, file watching, signals, systemd, logs,
limits, writer threads, and the daemon's own troubles.
"""
