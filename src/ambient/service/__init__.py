"""The daemon as a service: the composition root, the real adapters of the engine's ports, the tick's evaluators, file
watching, signals, systemd, logs, the daemon's own troubles.
"""
