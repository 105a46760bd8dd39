"""A disk that fills in the middle of a write, for a daemon started with ``AMBIENT_TEST_FULL_DISK=<trigger file>``.

While the trigger file exists the disk is full for the run journals (``.ambient/runs/*.jsonl``). The first write
there that holds a failed attempt's ``finished`` record is cut short the worst way a full disk can cut it: up to
that record and half of the next (the ``retry`` that routes it), then ENOSPC; the site then creates
``<trigger>.short``. Every other write to a run journal fails with ENOSPC at once. Other files are not touched.
"""

import errno
import os

_TRIGGER = os.environ.get("AMBIENT_TEST_FULL_DISK")

if _TRIGGER:
    _real_write = os.write
    _cut = {"done": False}

    def _run_journal(fd: int) -> bool:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return "/.ambient/runs/" in target and target.endswith(".jsonl")

    def _write(fd: int, data: bytes) -> int:
        if not _run_journal(fd) or not os.path.exists(_TRIGGER):
            return _real_write(fd, data)
        raw = bytes(data)
        if not _cut["done"]:
            start = 0
            for line in raw.splitlines(keepends=True):
                start += len(line)
                if b'"ev":"finished"' in line and b'"result":"success"' not in line and start < len(raw):
                    _cut["done"] = True
                    following = raw[start:].split(b"\n", 1)[0]
                    written = _real_write(fd, raw[: start + max(1, len(following) // 2)])
                    with open(_TRIGGER + ".short", "w") as marker:
                        marker.write(str(written))
                    return written
        raise OSError(errno.ENOSPC, "No space left on device")

    os.write = _write
