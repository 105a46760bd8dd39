"""Storage: how files are written (every module writes through it but the few ARCHITECTURE.md names): the brain's
layout (paths), atomic writes, capped reads and the sweep of temp files (fsutil), the flock guard that serialises
read-modify-writes (guard), YAML as text and as files, append-only JSON-lines journals.
"""
