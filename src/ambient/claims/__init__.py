"""Claims and locks (DESIGN 3-4, spec/002): the claim model and its transitions, a claim's status read from its
text alone, the claim store and census, pre-flight, circuit breakers, and the file-lock mutex under ``locks/``.
"""
