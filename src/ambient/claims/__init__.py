"""Claims and locks (DESIGN 3-4, spec/002): the claim model and its transitions (claim), a claim's status read from
its text alone (statusline), one claim file (claimfile), the claims census (index) and the claim store above it
(store); pre-flight's pure checks (preflight), the persisted circuit breakers (breakers) and the snapshot of the brain
they check (snapshot); the file-lock mutex under ``locks/``: the lock file's format (lockfile), a lock file judged on
disk (lockstate), the inodes behind held locks (lockinodes) and the lock manager (locks).
"""
