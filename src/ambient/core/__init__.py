"""Foundation: errors, problem reports, the clock, redaction, terminal text, path rules. Imports nothing of ambient
outside itself; every other package may use it.
"""
