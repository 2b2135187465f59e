"""The SQLite store's ``turns`` table: its schema, the session bounds that stand in for a
per-session index, and the upgrade of a schema-4 file to them.

**No index keyed by session.** Schema 4 kept two ``UNIQUE`` constraints led by the session,
``(session_id, turn_number)`` and ``(session_id, idempotency_key)``. An index clustered by
session puts each session's entries on leaf pages of their own, so a commit that accepts the
turns of 64 sessions rewrote up to 64 leaf pages of each: 16 to 22 µs of the commit stage's
~130 µs a turn at 64 sessions in flight (`benchmarks/bench_daemon.py --sessions 64`,
docs/performance.md). Schema 5 keeps neither:

* a session's turn numbers are unique by construction: ``sessions.turns`` hands them out in
  the accept's transaction, and the store has one writer;
* the idempotency key is unique per session through ``turns_by_key (idempotency_key,
  session_id)``, partial (a turn without a key has no entry). The key leads, so keys that grow
  with time, such as the client library's (``hc-`` and the time in nanoseconds first), fill the
  index's last pages instead of one page per session;
* a session's turns are found through ``sessions.first_turn_id`` and ``last_turn_id``, set in
  the accept's transaction (one statement a pass): a listing of one session reads the turns
  between its first and its last by their id, the primary key, and keeps that session's.
  That reads the turns other sessions took in between as well; a listing pages by turn id.

`upgrade_to_5` rebuilds a schema-4 table without the two constraints, in the schema upgrade's
transaction, and fills the bounds of every session from its turns.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Final

import orjson

__all__ = ["TURNS_SCHEMA", "mark_session_bounds", "upgrade_to_5"]

_TURNS_TABLE: Final = """CREATE TABLE IF NOT EXISTS {name}(
    turn_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    turn_number INTEGER NOT NULL,
    kind TEXT NOT NULL,
    command_type TEXT,
    spec BLOB NOT NULL,
    idempotency_key TEXT,
    state TEXT NOT NULL,
    round INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    accepted_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    next_attempt_us INTEGER,
    finished_us INTEGER,
    verdict TEXT,
    reason_code TEXT,
    reason TEXT,
    fault_type TEXT,
    result BLOB,
    owner TEXT,
    token INTEGER NOT NULL DEFAULT 0,
    lease_until_us INTEGER
);
"""
_TURN_INDEXES: Final = """CREATE UNIQUE INDEX IF NOT EXISTS turns_by_key
    ON turns(idempotency_key, session_id) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS turns_unfinished ON turns(turn_id)
    WHERE state IN ('accepted', 'running', 'waiting_retry');
CREATE INDEX IF NOT EXISTS turns_by_state ON turns(state, turn_id);
"""
#: The ``turns`` table and its indexes, as a new file of this schema creates them.
TURNS_SCHEMA: Final = _TURNS_TABLE.format(name="turns") + _TURN_INDEXES

_ALL_COLUMNS: Final = (
    "turn_id, session_id, turn_number, kind, command_type, spec, idempotency_key, state, round,"
    " attempt, accepted_us, updated_us, next_attempt_us, finished_us, verdict, reason_code,"
    " reason, fault_type, result, owner, token, lease_until_us"
)

#: Every session of a pass's accepts in one statement (its parameter: a JSON object of session
#: id -> [first, last] turn id taken in the pass).
_MARK_MANY: Final = (
    "UPDATE sessions SET first_turn_id = coalesce(first_turn_id, json_extract(j.value, '$[0]')),"
    " last_turn_id = json_extract(j.value, '$[1]') FROM json_each(?) AS j"
    " WHERE sessions.session_id = j.key"
)


def mark_session_bounds(conn: sqlite3.Connection, bounds: Mapping[str, tuple[int, int]]) -> None:
    """Record, in the open transaction, the first and last turn ids each session of *bounds*
    took (a session's first stays the first it ever took)."""
    if len(bounds) == 1:
        ((session_id, (first, last)),) = bounds.items()
        conn.execute(
            "UPDATE sessions SET first_turn_id = coalesce(first_turn_id, ?), last_turn_id = ?"
            " WHERE session_id = ?",
            (first, last, session_id),
        )
    elif bounds:
        conn.execute(_MARK_MANY, (orjson.dumps(dict(bounds)).decode(),))


def upgrade_to_5(conn: sqlite3.Connection) -> None:
    """Schema 4 -> 5 in the open transaction: the sessions' bounds filled, and ``turns``
    rebuilt without the two constraints led by the session (ids, rows and the id sequence
    kept). Runs with foreign keys off (``attempts`` refer to the table being replaced); the
    references are checked at the end. Parts already done are skipped."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(sessions)")}
    for name in ("first_turn_id", "last_turn_id"):
        if name not in columns:
            conn.execute(f"ALTER TABLE sessions ADD COLUMN {name} INTEGER")
    mine = "FROM turns t WHERE t.session_id = sessions.session_id"
    conn.execute(
        f"UPDATE sessions SET first_turn_id = (SELECT min(turn_id) {mine}),"
        f" last_turn_id = (SELECT max(turn_id) {mine})"
    )
    constrained = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'turns'"
        " AND name LIKE 'sqlite_autoindex_turns_%'"
    ).fetchone()[0]
    if constrained:
        sequence = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'turns'").fetchone()
        conn.execute(_TURNS_TABLE.format(name="turns_v5"))
        conn.execute(
            f"INSERT INTO turns_v5({_ALL_COLUMNS})"
            f" SELECT {_ALL_COLUMNS} FROM turns ORDER BY turn_id"
        )
        conn.execute("DROP TABLE turns")
        conn.execute("ALTER TABLE turns_v5 RENAME TO turns")
        if sequence is not None:  # ids never handed out again, even those of no row now
            conn.execute(
                "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'turns'", (sequence[0],)
            )
    for statement in _TURN_INDEXES.split(";"):
        if statement.strip():
            conn.execute(statement)
    broken = conn.execute("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise sqlite3.IntegrityError(
            f"the upgrade of turns left {len(broken)} rows that refer to nothing"
            f" (first: {broken[0]})"
        )
