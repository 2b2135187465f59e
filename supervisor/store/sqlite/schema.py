"""The turn store's SQLite schema: tables, version check, connections.

Design notes
------------
* **A new file, a new schema.** The engine keeps its own file (the caller passes the path, by
  convention ``<root>/state/turns.sqlite3``); it never reads the old intake's tables. The version
  lives in ``meta`` under the key ``turn_store_schema``; a file whose tables are not ours (no such
  key) is refused rather than written into.
* **Versions only move forward.** Opening a file whose version is newer than this code's
  `SCHEMA_VERSION` raises `SchemaVersionError` naming the file, both versions and what to do:
  the newer daemon's tables may mean things this one cannot know. An older version is upgraded
  by the steps in `_MIGRATIONS` inside one transaction (version 2 added ``ledger_lines``, 3 the
  sessions' ``tenant`` and ``priority``, NULL for the sessions opened before, 4 moved
  ``ledger_lines`` into rowid order: below, 5 took the indexes led by the session off
  ``turns``: `supervisor.store.sqlite.turns_table`).
* **Claims live on the turn row**: ``owner``, ``lease_until_us`` and ``token`` (only grows, one
  more on every claim). ``round`` counts escalation retries: attempts are keyed by
  ``(turn_id, round, attempt)`` so a fresh attempt budget numbers its attempts from 1 again and
  the earlier rounds stay as history.
* **Durability.** WAL with ``synchronous=FULL``: a commit fsyncs the WAL, so a committed change
  survives a power loss, not only a crash. The writer and the reader are separate connections
  (WAL lets a reader see every committed transaction without waiting for the writer).
* **Ledger lines ride in the turn's commit.** ``ledger_lines`` keeps the sealed exec and evidence
  lines that `finish` committed with the turn's ending: that one commit is the turn's durable
  step. The daemon syncs the JSONL files later in rounds and then trims what the files hold; after
  a crash it writes back the lines the files lost (``LedgerWriter.restore``).
* **Ledger lines are stored in the order they come.** ``ledger_lines`` is a rowid table (its
  key ``(ledger_id, seq)`` an index beside it), not a ``WITHOUT ROWID`` one: a pass's lines
  belong to as many ledgers as it has sessions, and clustered by ledger each one landed on
  another leaf page (lines of ~600 bytes, a handful per page), so a commit wrote a page per
  ledger. In rowid order they fill the table's last pages and only the small key index is
  touched per ledger: at 64 sessions the commit's CPU per turn went from ~110 to ~90 µs
  (`benchmarks/bench_daemon.py --sessions 64`, docs/performance.md). A trim deletes the oldest
  lines, the table's first pages.
* ``command_type`` is copied out of an instruction turn's spec at acceptance, so claims filter
  by it in SQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from supervisor.errors import SchemaVersionError, StoreError
from supervisor.store.sqlite.turns_table import TURNS_SCHEMA, upgrade_to_5

__all__ = [
    "ATTEMPT_COLUMNS",
    "SCHEMA_VERSION",
    "SESSION_COLUMNS",
    "TURN_COLUMNS",
    "UNFINISHED",
    "SchemaVersionError",
    "open_connections",
]

#: The schema this code writes. Raise it (and add a step to `_MIGRATIONS`) on every change.
SCHEMA_VERSION: Final = 5
_VERSION_KEY: Final = "turn_store_schema"

#: States a turn can still leave by itself (claimable, recoverable). ``escalated`` waits for a
#: person and the final states never move.
UNFINISHED: Final = ("accepted", "running", "waiting_retry")


_TABLES: Final = (
    """
CREATE TABLE IF NOT EXISTS meta(
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions(
    session_id TEXT PRIMARY KEY,
    package_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    work_order_id TEXT,
    workspace TEXT,
    state TEXT NOT NULL,
    opened_us INTEGER NOT NULL,
    closed_us INTEGER,
    turns INTEGER NOT NULL DEFAULT 0,
    tenant TEXT,
    priority INTEGER,
    first_turn_id INTEGER,
    last_turn_id INTEGER
);
"""
    + TURNS_SCHEMA
    + """CREATE TABLE IF NOT EXISTS attempts(
    turn_id INTEGER NOT NULL REFERENCES turns(turn_id),
    round INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    started_us INTEGER NOT NULL,
    executor_id TEXT,
    instruction_id TEXT,
    finished_us INTEGER,
    outcome TEXT,
    fault_type TEXT,
    exit_code INTEGER,
    decision TEXT,
    reason_code TEXT,
    reason TEXT,
    detail TEXT,
    duration_ms INTEGER,
    delay_ms INTEGER,
    extra BLOB,
    PRIMARY KEY(turn_id, round, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_lines(
    ledger_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry_hash TEXT NOT NULL,
    line BLOB NOT NULL,
    PRIMARY KEY(ledger_id, seq)
);
"""
)

#: version -> what upgrades a file from that version to the next one (SQL, or a function run in
#: the upgrade's transaction).
_MIGRATIONS: Final[Mapping[int, str | Callable[[sqlite3.Connection], None]]] = {
    1: """CREATE TABLE IF NOT EXISTS ledger_lines(
    ledger_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry_hash TEXT NOT NULL,
    line BLOB NOT NULL,
    PRIMARY KEY(ledger_id, seq)
) WITHOUT ROWID;""",
    2: """ALTER TABLE sessions ADD COLUMN tenant TEXT;
ALTER TABLE sessions ADD COLUMN priority INTEGER;""",
    3: """CREATE TABLE ledger_lines_in_rowid_order(
    ledger_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry_hash TEXT NOT NULL,
    line BLOB NOT NULL,
    PRIMARY KEY(ledger_id, seq)
);
INSERT INTO ledger_lines_in_rowid_order(ledger_id, seq, entry_hash, line)
    SELECT ledger_id, seq, entry_hash, line FROM ledger_lines ORDER BY ledger_id, seq;
DROP TABLE ledger_lines;
ALTER TABLE ledger_lines_in_rowid_order RENAME TO ledger_lines;""",
    4: upgrade_to_5,
}

TURN_COLUMNS: Final = (
    "turn_id, session_id, turn_number, kind, spec, idempotency_key, state, attempt, accepted_us,"
    " updated_us, next_attempt_us, finished_us, verdict, reason_code, reason, fault_type, result,"
    " owner, token, lease_until_us, round"
)
ATTEMPT_COLUMNS: Final = (
    "turn_id, round, attempt, started_us, executor_id, instruction_id, finished_us, outcome,"
    " fault_type, exit_code, decision, reason_code, reason, detail, duration_ms, delay_ms, extra"
)
SESSION_COLUMNS: Final = (
    "session_id, package_id, tier, work_order_id, workspace, state, opened_us, closed_us, turns,"
    " tenant, priority"
)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables, or check (and upgrade) the version of existing ones; one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        _upgrade(conn, path)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # Not executescript: that would COMMIT the open transaction first.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _upgrade(conn: sqlite3.Connection, path: Path) -> None:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    found: int | None = None
    if "meta" in tables:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (_VERSION_KEY,)).fetchone()
        found = None if row is None else int(row[0])
    if found is None:
        if tables - {"sqlite_sequence"}:
            raise SchemaVersionError(path, found=None, supported=SCHEMA_VERSION)
        _run_script(conn, _TABLES)
        conn.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?)", (_VERSION_KEY, str(SCHEMA_VERSION))
        )
        return
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(path, found=found, supported=SCHEMA_VERSION)
    while found < SCHEMA_VERSION:
        step = _MIGRATIONS.get(found)
        if step is None:
            raise SchemaVersionError(path, found=found, supported=SCHEMA_VERSION)
        if isinstance(step, str):
            _run_script(conn, step)
        else:
            step(conn)
        found += 1
    conn.execute("UPDATE meta SET value = ? WHERE key = ?", (str(SCHEMA_VERSION), _VERSION_KEY))


def _require_wal(conn: sqlite3.Connection, path: Path) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"turn store {path}: SQLite refused WAL mode (got {mode!r})")


def _connect(path: Path, *, writer: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(
        str(path),
        isolation_level=None,  # transactions are explicit (BEGIN IMMEDIATE / SAVEPOINT)
        check_same_thread=False,  # used from worker threads, one at a time (a limiter of 1)
        timeout=10.0,
        cached_statements=256,  # every statement the engine runs stays prepared
    )
    try:
        if writer:
            _require_wal(conn, path)
        conn.execute("PRAGMA synchronous=FULL")
        if not writer:  # the writer's foreign keys: once its schema is upgraded
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA query_only=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def open_connections(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """Open (creating if needed) the store at *path*: ``(writer, reader)``. Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _connect(path, writer=True)
    try:
        _migrate(writer, path)  # foreign keys off: an upgrade may rebuild a referred table
        writer.execute("PRAGMA foreign_keys=ON")
        reader = _connect(path, writer=False)
    except BaseException:
        writer.close()
        raise
    return writer, reader
