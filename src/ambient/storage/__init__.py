"""Storage: the only code that puts bytes on disk — the brain's layout (paths), atomic writes and capped reads
(fsutil), YAML as text and as files, append-only JSON-lines journals.
"""
