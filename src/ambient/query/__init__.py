"""The query store: one derived SQLite database (``.ambient/query.sqlite3``) indexing runs, items, claims,
escalations and costs, so that ``ambient status``, ``runs``, ``stats``, ``escalations`` and every page of the web
console answer from indexes instead of re-reading the brain's files. Kept current by the daemon as it writes and by
any reader that finds a file changed; rebuilt from the files when missing, torn or of another version. Never the
source of truth: nothing decides on it, everything in it can be thrown away.
"""
