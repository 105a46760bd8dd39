"""Storage: how files are written (every module writes through it but the few ARCHITECTURE.md names): the brain's
layout (paths), atomic writes, capped reads and the sweep of temp files (fsutil), the flock guard that serialises
read-modify-writes (guard), YAML as text and as files, append-only JSON-lines journals, the pool of spare files that
lock files come from (spares), the stamp of the code that fills a derived file (codestamp).
"""
