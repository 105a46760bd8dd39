"""The tables of the query store (``.ambient/query.sqlite3``) and their format version. Pure: text only.

Every row is derived from a file of the brain and can be thrown away; :mod:`ambient.query.store` fills them,
:mod:`ambient.query.views` reads them. Bump :data:`FORMAT` whenever a table or what a column means changes: a store
of another format is deleted and rebuilt from the files (so is one written by other code: see ``store._code``).

Tables:

``meta(key, value)``
    ``format`` (:data:`FORMAT`), ``code`` (the signature of the code that filled it), ``records_inode``,
    ``records_offset`` (bytes of ``runs.jsonl`` read: up to its last newline), ``records_lines`` (lines read),
    ``records_torn`` (``1`` when bytes follow the last newline: a crash mid-append).
``dirs(path, mtime_ns)``
    The folders listed at the last refresh, by ``mtime_ns``: one unchanged since is not listed again (every write
    of ambient is an atomic rename, which changes its folder's mtime).
``files(kind, name, inode, size, mtime_ns)``
    What was read of each file (kind ``claim``, ``escalation``, ``journal``): a claim or escalation is read again
    when its inode changed; a journal of a run not finished when its size or mtime changed.
``runs(run_id, ...)``
    One row per run journal: ``state`` ``running`` | ``finished`` | ``unreadable`` (a journal that does not fold:
    ``problem`` says ``file:line: why``), the workflow, form, outcome, ``started_at`` / ``finished_at`` (ISO text as
    journaled), item counts (``done``, ``total``, ``running``, ``failed``, ``waiting`` on the person), ``cost_usd``,
    ``tokens`` (input + output), ``usage`` (JSON: ``UsageTotals.to_record()``), ``tripped`` / ``holds`` (JSON lists,
    sorted), ``breaker`` (JSON object), ``cursor`` (chains), ``journal`` (file name).
``items(run_id, idx, ...)``
    One row per item or chain step: name, status, attempt, error, escalation, gate, ``first_start`` (the ``at`` of
    its first ``accepted``), ``ended_at`` (of its last ``finished`` or ``skipped`` while terminal), ``duration_ms``.
``records(line, ...)``
    One row per non-blank line of ``runs.jsonl`` (``line``: its 1-based line number): ``json`` the raw record text
    (NULL for a line that is not a JSON object: ``ambient stats`` reports it), run_id, workflow, outcome,
    started_at, completed_at, ``week`` (ISO week of ``started_at``, ``2026-W12``), escalations, errors, cost_usd.
``claims(file, ...)``
    One row per claim file: ``sess_id`` NULL when the file cannot be used; status, agent, parent
    (``parent_satellite``), type, scope, workflow, opened_at, closed_at, ``updated`` (the last time it holds:
    opened_at or its last gate), ``ttl`` (as written, text), ``times`` (JSON: ``ClaimFacts.times``), ``problems``
    (JSON ``[[line, message, severity], ...]``: its warnings, or why it cannot be used).
``claim_dups(file, sess_id, first)``
    The claim files that are not the first (by file name) of their ``sess_id`` (the claims census ignores them:
    a problem), with that first file; kept at each refresh for the sess_ids whose files changed, so counting claims
    needs no probe per claim row.
``escalations(id, ...)``
    One row per escalation file: status, kind, workflow, agent, run_id, item, step, ``where_``, question,
    ``options`` (JSON ``[[key, label, action], ...]``), created_at, deadline, decision, by_, channel, note,
    answered_at, notified (0/1), attempts, ``json`` (the whole escalation, ``model_dump(mode="json")``).
``problems(kind, file, line, message, severity)``
    Files that could not be read as what their folder holds (kind ``escalation``); claims keep theirs in their row.
``brain_facts(key, value)``
    What ``ambient status`` needs of the loaded brain (:mod:`ambient.query.facts`): ``inputs`` (the signature of
    the files and ``AMBIENT_*`` variables it was loaded from), ``facts`` (JSON: whether notifications are set up,
    the workflow files that do not load and the names each serves). Loaded again only when ``inputs`` changed.
"""

from __future__ import annotations

from typing import Final

#: Bumped when a table, an index or the meaning of a column changes (2: ``records_run``, a run page's record;
#: 3: ``brain_facts``, what ``ambient status`` knew only by loading the brain; 4: ``claim_dups`` and the covering
#: ``claims_status`` index, the overview's counts without a probe per claim).
FORMAT: Final = 4

TABLES: Final = (
    """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE dirs (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL)""",
    """CREATE TABLE files (
        kind TEXT NOT NULL, name TEXT NOT NULL, inode INTEGER NOT NULL, size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL, PRIMARY KEY (kind, name))""",
    """CREATE TABLE runs (
        run_id TEXT PRIMARY KEY, journal TEXT NOT NULL, state TEXT NOT NULL, workflow TEXT, form TEXT,
        outcome TEXT, started_at TEXT, finished_at TEXT, done INTEGER NOT NULL DEFAULT 0,
        total INTEGER NOT NULL DEFAULT 0, running INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
        waiting INTEGER NOT NULL DEFAULT 0, cost_usd REAL, tokens INTEGER, usage TEXT NOT NULL DEFAULT '{}',
        tripped TEXT NOT NULL DEFAULT '[]', holds TEXT NOT NULL DEFAULT '[]', breaker TEXT NOT NULL DEFAULT '{}',
        cursor INTEGER, problem TEXT)""",
    """CREATE TABLE items (
        run_id TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
        attempt INTEGER NOT NULL, error TEXT, escalation TEXT, gate TEXT, first_start TEXT, ended_at TEXT,
        duration_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, idx))""",
    """CREATE TABLE records (
        line INTEGER PRIMARY KEY, json TEXT, run_id TEXT, workflow TEXT, outcome TEXT, started_at TEXT,
        completed_at TEXT, week TEXT, escalations INTEGER, errors INTEGER, cost_usd REAL)""",
    """CREATE TABLE claims (
        file TEXT PRIMARY KEY, sess_id TEXT, status TEXT, agent TEXT, parent TEXT, type TEXT, scope TEXT,
        workflow TEXT, opened_at TEXT, closed_at TEXT, updated TEXT, ttl TEXT, times TEXT NOT NULL DEFAULT '[]',
        problems TEXT NOT NULL DEFAULT '[]')""",
    """CREATE TABLE claim_dups (file TEXT PRIMARY KEY, sess_id TEXT NOT NULL, first TEXT NOT NULL)""",
    """CREATE TABLE escalations (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, kind TEXT NOT NULL, workflow TEXT NOT NULL, agent TEXT,
        run_id TEXT NOT NULL, item TEXT, step TEXT, where_ TEXT NOT NULL, question TEXT NOT NULL,
        options TEXT NOT NULL, created_at TEXT NOT NULL, deadline TEXT, decision TEXT, by_ TEXT, channel TEXT,
        note TEXT, answered_at TEXT, notified INTEGER NOT NULL, attempts INTEGER NOT NULL, json TEXT NOT NULL)""",
    """CREATE TABLE problems (
        kind TEXT NOT NULL, file TEXT NOT NULL, line INTEGER, message TEXT NOT NULL, severity TEXT NOT NULL)""",
    """CREATE TABLE brain_facts (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
)

INDEXES: Final = (
    "CREATE INDEX runs_state ON runs (state, workflow)",
    "CREATE INDEX runs_workflow ON runs (workflow, finished_at)",
    "CREATE INDEX records_workflow ON records (workflow, line)",
    "CREATE INDEX records_week ON records (week)",
    "CREATE INDEX records_completed ON records (completed_at)",
    "CREATE INDEX records_run ON records (run_id, line)",
    "CREATE INDEX claims_sess ON claims (sess_id, file)",
    "CREATE INDEX claims_status ON claims (status, sess_id)",  # covers the counts by status
    "CREATE INDEX claims_problems ON claims (file) WHERE problems != '[]'",
    "CREATE INDEX escalations_status ON escalations (status, created_at, id)",
    "CREATE INDEX escalations_run ON escalations (run_id)",
    "CREATE INDEX problems_kind ON problems (kind, file)",
)
