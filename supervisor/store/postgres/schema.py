"""The turn store's PostgreSQL schema: tables, versioned migrations, the version check.

Design notes
------------
* **The version lives in the database**, in ``hunter_meta`` under ``turn_store_schema``. A
  database with tables but no such key is not a turn store and is refused; an empty database is
  "not yet migrated".
* **Migrations are explicit steps**, ``_MIGRATIONS[n]`` upgrading version ``n`` to ``n + 1``
  (version 0 = nothing). `migrate` runs the missing steps in one transaction under a
  transaction-level advisory lock, so two daemons (or ``hunter store migrate`` and a daemon)
  starting at once cannot both apply a step. `check_schema` only reads: a version newer than
  `SCHEMA_VERSION` raises `SchemaVersionError` (a newer hunter wrote it), an older one or none
  raises `SchemaNotMigratedError` (a `SchemaVersionError`) saying to run ``hunter store migrate``.
* The tables follow the SQLite engine's, column for column (the row converters are shared):
  claims live on the turn row (``owner``, ``lease_until_us``, ``token`` that only grows),
  attempts are keyed by ``(turn_id, round, attempt)``, ledger lines by ``(ledger_id, seq)``.
  Times are integer microseconds (BIGINT); JSON is stored as the exact bytes written (BYTEA), so
  both engines read back the same values.
* ``turns_claimable`` is a partial index over the unfinished turns: claims scan only those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import asyncpg

from supervisor.errors import SchemaVersionError

__all__ = [
    "ATTEMPT_COLUMNS",
    "SCHEMA_VERSION",
    "SESSION_COLUMNS",
    "TURN_COLUMNS",
    "UNFINISHED",
    "SchemaNotMigratedError",
    "check_schema",
    "migrate",
]

#: The schema this code reads and writes. Raise it and add a step to `_MIGRATIONS` on a change.
SCHEMA_VERSION: Final = 4
_VERSION_KEY: Final = "turn_store_schema"
#: ``pg_advisory_xact_lock`` key taken by `migrate` (any fixed number; "hunt" in ASCII)
_MIGRATION_LOCK: Final = 0x68756E74

#: States a turn can still leave by itself (claimable, recoverable).
UNFINISHED: Final = ("accepted", "running", "waiting_retry")


class SchemaNotMigratedError(SchemaVersionError):
    """Raised when the database holds no turn store schema yet, or an older version than this
    code's, and the store was opened without migrating: run ``hunter store migrate``."""

    def __init__(self, where: str, *, found: int | None, supported: int) -> None:
        super().__init__(where, found=found, supported=supported)
        have = "no turn store schema yet" if found is None else f"schema version {found}"
        self.args = (
            f"turn store {where} has {have}; this hunter needs version {supported}. Run"
            " `hunter store migrate` against it first",
        )


_V1: Final = """
CREATE TABLE hunter_meta(
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE sessions(
    session_id TEXT PRIMARY KEY,
    package_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    work_order_id TEXT,
    workspace TEXT,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed')),
    opened_us BIGINT NOT NULL,
    closed_us BIGINT,
    turns BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE turns(
    turn_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    turn_number BIGINT NOT NULL,
    kind TEXT NOT NULL,
    command_type TEXT,
    spec BYTEA NOT NULL,
    idempotency_key TEXT,
    state TEXT NOT NULL,
    round BIGINT NOT NULL DEFAULT 0,
    attempt BIGINT NOT NULL DEFAULT 0,
    accepted_us BIGINT NOT NULL,
    updated_us BIGINT NOT NULL,
    next_attempt_us BIGINT,
    finished_us BIGINT,
    verdict TEXT,
    reason_code TEXT,
    reason TEXT,
    fault_type TEXT,
    result BYTEA,
    owner TEXT,
    token BIGINT NOT NULL DEFAULT 0,
    lease_until_us BIGINT,
    UNIQUE(session_id, turn_number),
    UNIQUE(session_id, idempotency_key)
);
CREATE INDEX turns_claimable ON turns(turn_id)
    WHERE state IN ('accepted', 'running', 'waiting_retry');
CREATE INDEX turns_by_state ON turns(state, turn_id);
CREATE INDEX turns_by_owner ON turns(owner) WHERE owner IS NOT NULL;
CREATE TABLE attempts(
    turn_id BIGINT NOT NULL REFERENCES turns(turn_id),
    round BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    started_us BIGINT NOT NULL,
    executor_id TEXT,
    instruction_id TEXT,
    finished_us BIGINT,
    outcome TEXT,
    fault_type TEXT,
    exit_code BIGINT,
    decision TEXT,
    reason_code TEXT,
    reason TEXT,
    detail TEXT,
    duration_ms BIGINT,
    delay_ms BIGINT,
    extra BYTEA,
    PRIMARY KEY(turn_id, round, attempt)
);
CREATE TABLE ledger_lines(
    ledger_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    entry_hash TEXT NOT NULL,
    line BYTEA NOT NULL,
    PRIMARY KEY(ledger_id, seq)
);
"""

#: Version 2: several daemons (`supervisor.store.fleet`): session homes, heartbeats, anchored
#: ledger heads, resolutions asked of a session's home.
_V2: Final = """
ALTER TABLE sessions ADD COLUMN home TEXT;
ALTER TABLE sessions ADD COLUMN home_token BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN home_until_us BIGINT;
CREATE INDEX sessions_homeless ON sessions(home_until_us) WHERE state = 'open';
ALTER TABLE turns ADD COLUMN resolution TEXT;
CREATE INDEX turns_resolution ON turns(session_id) WHERE resolution IS NOT NULL;
CREATE TABLE daemons(
    owner TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    started_us BIGINT NOT NULL,
    heartbeat_us BIGINT NOT NULL,
    info BYTEA NOT NULL
);
CREATE TABLE ledger_heads(
    ledger_id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    entry_hash TEXT NOT NULL
);
INSERT INTO ledger_heads(ledger_id, seq, entry_hash)
    SELECT DISTINCT ON (ledger_id) ledger_id, seq, entry_hash FROM ledger_lines
    ORDER BY ledger_id, seq DESC;
"""

#: Version 3: a session's tenant label and priority (the fair order of parked turns); NULL for
#: the sessions opened before.
_V3: Final = """
ALTER TABLE sessions ADD COLUMN tenant TEXT;
ALTER TABLE sessions ADD COLUMN priority BIGINT;
"""

#: Version 4: who asked for a resolution of another daemon's session (``decided_by``, JSON):
#: the home records it with the ending (`supervisor.turns.decisions`).
_V4: Final = """
ALTER TABLE turns ADD COLUMN resolution_by BYTEA;
"""

#: version -> the SQL that upgrades a database from that version to the next one.
_MIGRATIONS: Final[Mapping[int, str]] = {0: _V1, 1: _V2, 2: _V3, 3: _V4}

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


async def _found_version(conn: asyncpg.Connection, where: str) -> int | None:
    """The stored version; None for an empty database; `SchemaVersionError` for foreign
    tables."""
    tables = {
        str(r[0])
        for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    }
    if "hunter_meta" in tables:
        value = await conn.fetchval("SELECT value FROM hunter_meta WHERE key = $1", _VERSION_KEY)
        if value is not None:
            return int(str(value))
    if tables:
        raise SchemaVersionError(where, found=None, supported=SCHEMA_VERSION)
    return None


async def check_schema(conn: asyncpg.Connection, where: str) -> int:
    """Check that the database holds this code's schema version (reads only)."""
    found = await _found_version(conn, where)
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaVersionError(where, found=found, supported=SCHEMA_VERSION)
    if found is None or found < SCHEMA_VERSION:
        raise SchemaNotMigratedError(where, found=found, supported=SCHEMA_VERSION)
    return found


async def migrate(conn: asyncpg.Connection, where: str) -> tuple[int | None, int]:
    """Bring the database to `SCHEMA_VERSION` (one transaction, under an advisory lock):
    ``(version found, version now)``. A newer version raises `SchemaVersionError`."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        found = await _found_version(conn, where)
        version = 0 if found is None else found
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(where, found=found, supported=SCHEMA_VERSION)
        while version < SCHEMA_VERSION:
            step = _MIGRATIONS.get(version)
            if step is None:
                raise SchemaVersionError(where, found=found, supported=SCHEMA_VERSION)
            await conn.execute(step)
            version += 1
        await conn.execute(
            "INSERT INTO hunter_meta(key, value) VALUES ($1, $2)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            _VERSION_KEY,
            str(SCHEMA_VERSION),
        )
    return found, version
