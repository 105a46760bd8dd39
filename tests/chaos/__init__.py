"""Faults: kill -9, power loss, full disks, soak (the long profiles are opt-in markers)."""
