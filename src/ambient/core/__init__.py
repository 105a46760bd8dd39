"""Foundation: errors, problem reports, the clock, redaction, terminal text, path rules, process identity (pid and
start time). Imports nothing of ambient outside itself; every other package may use it.
"""
