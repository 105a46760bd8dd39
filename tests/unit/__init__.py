"""Unit tests, one folder per package of src/ambient (pure rules and thin shells, mostly in-process)."""
