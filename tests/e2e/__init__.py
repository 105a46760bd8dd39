"""End to end: the real daemon and real agent processes, driven in-process or as subprocesses."""
