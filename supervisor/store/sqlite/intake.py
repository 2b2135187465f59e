"""Durable intake: sessions, turns and attempts in SQLite (WAL), so accepted work survives a crash.

Design notes
------------
* **Accepted means durable.** `accept_turn` commits the turn row before it returns, and the control
  API acknowledges a submission only after that. The database runs in WAL mode with
  ``synchronous=FULL``: every commit fsyncs the WAL, so a committed turn survives a power loss, not
  only a process crash (``NORMAL`` would sync the WAL only at checkpoints and could lose the last
  transactions on power loss, which would break the promise made in the acknowledgement).
* **Group commit.** An fsync per submission would cap intake at a few thousand turns per second.
  `IntakeCommitter` collects the operations that arrive while a commit is in progress and runs
  them together in one transaction (one fsync) on a worker thread; every caller gets its own
  result or exception (each operation runs inside its own SAVEPOINT, so a failing operation does
  not spoil its neighbours).
* **Idempotency.** ``(session_id, idempotency_key)`` is unique: resubmitting returns the turn that
  was accepted first (``created=False``); nothing is written twice.
* **Turn states.** ``accepted -> running (attempt n) -> waiting_retry -> running ... ->`` one of
  the final states ``succeeded, failed, terminated, exhausted, cancelled, timeout, violation,
  rejected``. ``escalated`` parks a turn until an operator resolves it (back to ``accepted`` for a
  retry, or ``terminated``).
* **Recovery.** A turn found in ``running`` when the daemon starts was interrupted mid-attempt; the
  scheduler records that attempt as a CRASH fault and sends it through the policy
  (`unfinished_turns`). ``accepted`` and ``waiting_retry`` turns are simply scheduled again.

One connection, used by one thread at a time (the committer serialises every call). Plain
synchronous methods are there for tests and tools; the daemon goes through the committer.
"""

from __future__ import annotations

import asyncio
import enum
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import orjson

from sandbox.policy.lifecycle import FINAL_STATES, TurnKind, TurnState
from supervisor.errors import (
    IntakeClosedError,
    IntakeError,
    UnknownSessionError,
    UnknownTurnError,
)

__all__ = [
    "FINAL_STATES",
    "AttemptRow",
    "CommitterStatistics",
    "Intake",
    "IntakeClosedError",
    "IntakeCommitter",
    "IntakeError",
    "Pending",
    "SessionRow",
    "SessionState",
    "TurnKind",
    "TurnRow",
    "TurnState",
    "UnknownSessionError",
    "UnknownTurnError",
    "now_us",
]

T = TypeVar("T")

SCHEMA_VERSION = 1


def now_us() -> int:
    """Wall-clock time in integer microseconds since the epoch (the ledgers' unit)."""
    return time.time_ns() // 1000


class SessionState(enum.StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    package_id: str
    tier: str
    work_order_id: str | None
    workspace: str | None
    state: SessionState
    opened_us: int
    closed_us: int | None
    next_turn_number: int

    def to_dict(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "package_id": self.package_id,
            "tier": self.tier,
            "work_order_id": self.work_order_id,
            "workspace": self.workspace,
            "state": self.state.value,
            "opened_us": self.opened_us,
            "closed_us": self.closed_us,
            "turns": self.next_turn_number - 1,
        }


@dataclass(frozen=True, slots=True)
class AttemptRow:
    turn_id: int
    attempt: int
    started_us: int
    executor_id: str | None = None
    instruction_id: str | None = None
    finished_us: int | None = None
    outcome: str | None = None
    fault_type: str | None = None
    exit_code: int | None = None
    decision: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    detail: str | None = None
    duration_ms: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "executor_id": self.executor_id,
            "instruction_id": self.instruction_id,
            "started_us": self.started_us,
            "finished_us": self.finished_us,
            "outcome": self.outcome,
            "fault_type": self.fault_type,
            "exit_code": self.exit_code,
            "decision": self.decision,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "detail": self.detail,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True, slots=True)
class TurnRow:
    turn_id: int
    session_id: str
    turn_number: int
    kind: TurnKind
    spec: Mapping[str, Any]
    idempotency_key: str | None
    state: TurnState
    attempt: int
    accepted_us: int
    updated_us: int
    next_attempt_us: int | None = None
    finished_us: int | None = None
    verdict: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    fault_type: str | None = None
    result: Mapping[str, Any] | None = None
    attempts: tuple[AttemptRow, ...] = field(default=())

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def to_dict(self) -> dict[str, object]:
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "kind": self.kind.value,
            "spec": dict(self.spec),
            "idempotency_key": self.idempotency_key,
            "state": self.state.value,
            "final": self.final,
            "attempt": self.attempt,
            "accepted_us": self.accepted_us,
            "updated_us": self.updated_us,
            "next_attempt_us": self.next_attempt_us,
            "finished_us": self.finished_us,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "fault_type": self.fault_type,
            "result": dict(self.result) if self.result is not None else None,
            "attempts": [a.to_dict() for a in self.attempts],
        }


_SCHEMA = """
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
    next_turn_number INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS turns(
    turn_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    turn_number INTEGER NOT NULL,
    kind TEXT NOT NULL,
    spec BLOB NOT NULL,
    idempotency_key TEXT,
    state TEXT NOT NULL,
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
    UNIQUE(session_id, turn_number),
    UNIQUE(session_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS turns_by_state ON turns(state);
CREATE TABLE IF NOT EXISTS attempts(
    turn_id INTEGER NOT NULL REFERENCES turns(turn_id),
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
    PRIMARY KEY(turn_id, attempt)
);
"""

_TURN_COLUMNS = (
    "turn_id, session_id, turn_number, kind, spec, idempotency_key, state, attempt, accepted_us,"
    " updated_us, next_attempt_us, finished_us, verdict, reason_code, reason, fault_type, result"
)
_ATTEMPT_COLUMNS = (
    "turn_id, attempt, started_us, executor_id, instruction_id, finished_us, outcome, fault_type,"
    " exit_code, decision, reason_code, reason, detail, duration_ms"
)
_SESSION_COLUMNS = (
    "session_id, package_id, tier, work_order_id, workspace, state, opened_us, closed_us,"
    " next_turn_number"
)


def _session_from_row(row: Sequence[Any]) -> SessionRow:
    return SessionRow(
        session_id=row[0],
        package_id=row[1],
        tier=row[2],
        work_order_id=row[3],
        workspace=row[4],
        state=SessionState(row[5]),
        opened_us=row[6],
        closed_us=row[7],
        next_turn_number=row[8],
    )


def _turn_from_row(row: Sequence[Any], attempts: tuple[AttemptRow, ...]) -> TurnRow:
    return TurnRow(
        turn_id=row[0],
        session_id=row[1],
        turn_number=row[2],
        kind=TurnKind(row[3]),
        spec=orjson.loads(row[4]),
        idempotency_key=row[5],
        state=TurnState(row[6]),
        attempt=row[7],
        accepted_us=row[8],
        updated_us=row[9],
        next_attempt_us=row[10],
        finished_us=row[11],
        verdict=row[12],
        reason_code=row[13],
        reason=row[14],
        fault_type=row[15],
        result=orjson.loads(row[16]) if row[16] is not None else None,
        attempts=attempts,
    )


def _require_wal(path: Path, mode: object) -> None:
    if str(mode).lower() != "wal":
        raise IntakeError(f"intake {path}: SQLite refused WAL mode (got {mode!r})")


class Intake:
    """The intake database. Not thread-safe by itself: one caller at a time (see the committer)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._closed = False

    @classmethod
    def open(cls, path: Path) -> Intake:
        """Open (creating if needed) the intake database at *path*."""
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=10.0
        )
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            _require_wal(path, mode)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __enter__(self) -> Intake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------

    def run_batch(self, ops: Sequence[Callable[[], object]]) -> list[tuple[bool, object]]:
        """Run *ops* in one transaction (one fsync); each op all-or-nothing.

        Returns one ``(ok, value_or_exception)`` pair per op, in order. A failing op leaves no
        trace and does not spoil its neighbours. The batch first runs without savepoints (two
        statements less per op: the hot path, where nothing fails); if an op raises, the whole
        transaction is rolled back and the batch runs again with a savepoint around each op.
        Ops only touch the database, so running them again gives the same results.
        """
        if self._closed:
            raise IntakeClosedError("intake is closed")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results: list[tuple[bool, object]] = []
            for op in ops:
                try:
                    results.append((True, op()))
                except Exception:
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN IMMEDIATE")
                    results = self._run_isolated(ops)
                    break
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results

    def _run_isolated(self, ops: Sequence[Callable[[], object]]) -> list[tuple[bool, object]]:
        """Run *ops* in the open transaction, each in its own savepoint."""
        conn = self._conn
        results: list[tuple[bool, object]] = []
        for op in ops:
            conn.execute("SAVEPOINT op")
            try:
                value = op()
            except Exception as exc:  # handed back to that op's caller
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                results.append((False, exc))
            else:
                conn.execute("RELEASE op")
                results.append((True, value))
        return results

    def _one(self, op: Callable[[], T]) -> T:
        ((ok, value),) = self.run_batch([op])
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    # -- sessions -------------------------------------------------------------------------

    def op_open_session(
        self,
        *,
        session_id: str,
        package_id: str,
        tier: str,
        work_order_id: str | None = None,
        workspace: str | None = None,
    ) -> SessionRow:
        ts = now_us()
        self._conn.execute(
            f"INSERT INTO sessions({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, 1)",
            (session_id, package_id, tier, work_order_id, workspace, SessionState.OPEN.value, ts),
        )
        return self.op_get_session(session_id)

    def op_close_session(self, session_id: str) -> SessionRow:
        self.op_get_session(session_id)
        self._conn.execute(
            "UPDATE sessions SET state = ?, closed_us = ? WHERE session_id = ? AND state = ?",
            (SessionState.CLOSED.value, now_us(), session_id, SessionState.OPEN.value),
        )
        return self.op_get_session(session_id)

    def op_get_session(self, session_id: str) -> SessionRow:
        row = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise UnknownSessionError(session_id)
        return _session_from_row(row)

    def op_list_sessions(self, *, state: SessionState | None = None) -> list[SessionRow]:
        if state is None:
            rows = self._conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY opened_us"
            ).fetchall()
        else:
            rows = self._conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE state = ? ORDER BY opened_us",
                (state.value,),
            ).fetchall()
        return [_session_from_row(r) for r in rows]

    # -- turns ----------------------------------------------------------------------------

    def op_accept_turn(
        self,
        *,
        session_id: str,
        kind: TurnKind,
        spec: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> tuple[TurnRow, bool]:
        """Accept a turn; returns ``(turn, created)``. ``created`` is False for a resubmission."""
        if idempotency_key is not None:
            existing = self.op_find_turn(session_id, idempotency_key)
            if existing is not None:
                return existing, False
        # Take the session's next turn number in one statement (this is every submission's
        # path); only when no open session matched, find out why.
        taken = self._conn.execute(
            "UPDATE sessions SET next_turn_number = next_turn_number + 1"
            " WHERE session_id = ? AND state = ? RETURNING next_turn_number - 1",
            (session_id, SessionState.OPEN.value),
        ).fetchall()
        if not taken:
            self.op_get_session(session_id)  # raises UnknownSessionError
            raise IntakeError(f"session {session_id} is closed; open a new session")
        number = int(taken[0][0])
        ts = now_us()
        blob = orjson.dumps(dict(spec))
        cur = self._conn.execute(
            "INSERT INTO turns(session_id, turn_number, kind, spec, idempotency_key, state,"
            " attempt, accepted_us, updated_us) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
            (
                session_id,
                number,
                kind.value,
                blob,
                idempotency_key,
                TurnState.ACCEPTED.value,
                ts,
                ts,
            ),
        )
        turn_id = cur.lastrowid
        assert turn_id is not None
        # The row just inserted, built here instead of read back (the hot path of every
        # submission): the spec goes through the same JSON round trip as a stored one.
        turn = TurnRow(
            turn_id=turn_id,
            session_id=session_id,
            turn_number=number,
            kind=kind,
            spec=orjson.loads(blob),
            idempotency_key=idempotency_key,
            state=TurnState.ACCEPTED,
            attempt=0,
            accepted_us=ts,
            updated_us=ts,
        )
        return turn, True

    def op_find_turn(self, session_id: str, idempotency_key: str) -> TurnRow | None:
        """The turn accepted earlier with this idempotency key, or None."""
        row = self._conn.execute(
            "SELECT turn_id FROM turns WHERE session_id = ? AND idempotency_key = ?",
            (session_id, idempotency_key),
        ).fetchone()
        return None if row is None else self.op_get_turn(int(row[0]))

    def op_get_turn(self, turn_id: int) -> TurnRow:
        row = self._conn.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE turn_id = ?", (turn_id,)
        ).fetchone()
        if row is None:
            raise UnknownTurnError(turn_id)
        return _turn_from_row(row, self._attempts_of(turn_id))

    def _attempts_of(self, turn_id: int) -> tuple[AttemptRow, ...]:
        return tuple(
            AttemptRow(*a)
            for a in self._conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE turn_id = ? ORDER BY attempt",
                (turn_id,),
            ).fetchall()
        )

    def op_list_turns(
        self,
        *,
        session_id: str | None = None,
        states: Iterable[TurnState] | None = None,
        limit: int | None = None,
    ) -> list[TurnRow]:
        where: list[str] = []
        args: list[object] = []
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if states is not None:
            values = [s.value for s in states]
            where.append(f"state IN ({', '.join('?' for _ in values)})")
            args.extend(values)
        sql = "SELECT turn_id FROM turns"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY turn_id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        ids = [int(r[0]) for r in self._conn.execute(sql, args)]
        return [self.op_get_turn(i) for i in ids]

    def op_counts(self) -> dict[str, int]:
        return {
            str(state): int(n)
            for state, n in self._conn.execute("SELECT state, count(*) FROM turns GROUP BY state")
        }

    def op_start_attempt(
        self,
        turn_id: int,
        *,
        attempt: int,
        executor_id: str | None = None,
        instruction_id: str | None = None,
    ) -> None:
        """Mark the turn ``running`` with attempt *attempt* (written before the attempt starts)."""
        ts = now_us()
        cur = self._conn.execute(
            "UPDATE turns SET state = ?, attempt = ?, updated_us = ?, next_attempt_us = NULL"
            " WHERE turn_id = ?",
            (TurnState.RUNNING.value, attempt, ts, turn_id),
        )
        if cur.rowcount == 0:
            raise UnknownTurnError(turn_id)
        self._conn.execute(
            f"INSERT OR REPLACE INTO attempts({_ATTEMPT_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
            (turn_id, attempt, ts, executor_id, instruction_id),
        )

    def op_finish_attempt(self, row: AttemptRow) -> None:
        """Record how an attempt ended (outcome, fault, decision)."""
        self._conn.execute(
            f"INSERT OR REPLACE INTO attempts({_ATTEMPT_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.turn_id,
                row.attempt,
                row.started_us,
                row.executor_id,
                row.instruction_id,
                row.finished_us,
                row.outcome,
                row.fault_type,
                row.exit_code,
                row.decision,
                row.reason_code,
                row.reason,
                row.detail,
                row.duration_ms,
            ),
        )

    def op_set_state(
        self,
        turn_id: int,
        state: TurnState,
        *,
        next_attempt_us: int | None = None,
        verdict: str | None = None,
        reason_code: str | None = None,
        reason: str | None = None,
        fault_type: str | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> TurnRow:
        """Move a turn to *state*; final states also stamp ``finished_us``."""
        ts = now_us()
        finished = ts if state in FINAL_STATES else None
        # RETURNING hands back the updated row in the same statement (no second SELECT).
        rows = self._conn.execute(
            "UPDATE turns SET state = ?, updated_us = ?, next_attempt_us = ?, finished_us = ?,"
            " verdict = coalesce(?, verdict), reason_code = coalesce(?, reason_code),"
            " reason = coalesce(?, reason), fault_type = coalesce(?, fault_type),"
            f" result = coalesce(?, result) WHERE turn_id = ? RETURNING {_TURN_COLUMNS}",
            (
                state.value,
                ts,
                next_attempt_us,
                finished,
                verdict,
                reason_code,
                reason,
                fault_type,
                orjson.dumps(dict(result)) if result is not None else None,
                turn_id,
            ),
        ).fetchall()
        if not rows:
            raise UnknownTurnError(turn_id)
        return _turn_from_row(rows[0], self._attempts_of(turn_id))

    def op_record_attempts(
        self,
        rows: Sequence[AttemptRow],
        turn_id: int,
        state: TurnState,
        **set_state: Any,
    ) -> TurnRow:
        """Record finished attempts and move the turn to *state*, in one operation."""
        for row in rows:
            self.op_finish_attempt(row)
        return self.op_set_state(turn_id, state, **set_state)

    # -- synchronous conveniences (tests, tools) ------------------------------------------

    def open_session(self, **kw: Any) -> SessionRow:
        return self._one(lambda: self.op_open_session(**kw))

    def close_session(self, session_id: str) -> SessionRow:
        return self._one(lambda: self.op_close_session(session_id))

    def get_session(self, session_id: str) -> SessionRow:
        return self._one(lambda: self.op_get_session(session_id))

    def list_sessions(self, *, state: SessionState | None = None) -> list[SessionRow]:
        return self._one(lambda: self.op_list_sessions(state=state))

    def accept_turn(self, **kw: Any) -> tuple[TurnRow, bool]:
        return self._one(lambda: self.op_accept_turn(**kw))

    def get_turn(self, turn_id: int) -> TurnRow:
        return self._one(lambda: self.op_get_turn(turn_id))

    def list_turns(self, **kw: Any) -> list[TurnRow]:
        return self._one(lambda: self.op_list_turns(**kw))

    def counts(self) -> dict[str, int]:
        return self._one(self.op_counts)

    def start_attempt(self, turn_id: int, **kw: Any) -> None:
        self._one(lambda: self.op_start_attempt(turn_id, **kw))

    def finish_attempt(self, row: AttemptRow) -> None:
        self._one(lambda: self.op_finish_attempt(row))

    def set_state(self, turn_id: int, state: TurnState, **kw: Any) -> TurnRow:
        return self._one(lambda: self.op_set_state(turn_id, state, **kw))

    def unfinished_turns(self) -> list[TurnRow]:
        return self._one(self.op_unfinished_turns)

    def op_unfinished_turns(self) -> list[TurnRow]:
        """Turns to pick up after a (re)start: accepted, running, waiting_retry, escalated."""
        return self.op_list_turns(
            states=(
                TurnState.ACCEPTED,
                TurnState.RUNNING,
                TurnState.WAITING_RETRY,
                TurnState.ESCALATED,
            )
        )


@dataclass(slots=True)
class Pending:
    """An operation queued on the committer; `result` waits until its batch is committed."""

    op: Callable[[], object]
    done: anyio.Event
    on_commit: Callable[[], None] | None = None
    ok: bool = False
    value: object = None

    def _resolve(self, ok: bool, value: object) -> None:
        self.ok = ok
        self.value = value
        if ok and self.on_commit is not None:
            self.on_commit()
        self.done.set()

    async def result(self) -> object:
        await self.done.wait()
        if not self.ok:
            assert isinstance(self.value, BaseException)
            raise self.value
        return self.value


@dataclass(frozen=True, slots=True)
class CommitterStatistics:
    batches: int
    operations: int
    largest_batch: int
    pending: int


class IntakeCommitter:
    """Group commit for the daemon: `call` queues an op; batches are committed on a thread.

    While operations keep arriving, one worker thread (started with `anyio.to_thread`, on its
    own capacity limiter) commits batch after batch without a trip through the event loop in
    between: each batch's results go back to the loop with ``call_soon_threadsafe`` and the
    thread takes the next batch at once. Under load the commit cycle is then the database's
    (statements + one fsync), not the database's plus two thread hops plus an event-loop pass;
    the batches are also larger because the ops of a whole cycle are collected. When the queue
    is empty the thread returns and `run` waits for the next operation. (A thread lingering
    for the next op was tried: it takes a batch as soon as one op arrives, so commits get
    smaller, and it gave no measurable gain.)
    """

    def __init__(self, intake: Intake, *, max_batch: int = 512) -> None:
        self.intake = intake
        self._max_batch = max_batch
        self._queue: list[Pending] = []
        # Guards `_queue` (the event loop appends, the commit thread takes).
        self._queue_lock = threading.Lock()
        self._wakeup = anyio.Event()
        # Its own thread token: commits never queue behind other blocking work (ledger appends
        # wait for their fsync on worker threads of the default limiter).
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False
        self._batches = 0
        self._ops = 0
        self._largest = 0

    def statistics(self) -> CommitterStatistics:
        return CommitterStatistics(
            batches=self._batches,
            operations=self._ops,
            largest_batch=self._largest,
            pending=len(self._queue),
        )

    async def call(self, op: Callable[[], T]) -> T:
        """Run *op* inside the next committed batch; returns its value or raises its exception."""
        return await self.enqueue(op).result()  # type: ignore[return-value]

    def enqueue(
        self, op: Callable[[], object], *, on_commit: Callable[[], None] | None = None
    ) -> Pending:
        """Queue *op* without waiting; ``on_commit`` runs (in the event loop) once it is durable."""
        if self._closed:
            raise IntakeClosedError("intake committer is closed")
        pending = Pending(op=op, done=anyio.Event(), on_commit=on_commit)
        with self._queue_lock:
            self._queue.append(pending)
        self._wakeup.set()
        return pending

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Commit loop; runs until cancelled, then fails whatever is still queued."""
        loop = asyncio.get_running_loop()
        task_status.started()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                if self._queue:
                    # Shielded: a batch that reached the database finishes and its callers
                    # learn the result; cancelling mid-commit would leave callers not knowing
                    # what was written. The thread returns as soon as the queue is empty.
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(
                            self._commit_until_empty, loop, limiter=self._limiter
                        )
        finally:
            self._closed = True
            with self._queue_lock:
                left, self._queue = self._queue, []
            for pending in left:
                pending._resolve(False, IntakeClosedError("intake committer stopped"))

    def _commit_until_empty(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the commit thread: commit queued batches until none is left."""
        while True:
            with self._queue_lock:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
            if not batch:
                return
            try:
                outcome: list[tuple[bool, object]] | BaseException = self.intake.run_batch(
                    [p.op for p in batch]
                )
            except Exception as exc:  # every caller of this batch gets it
                outcome = exc
            try:
                loop.call_soon_threadsafe(self._resolve, batch, outcome)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                return

    def _resolve(
        self, batch: list[Pending], outcome: list[tuple[bool, object]] | BaseException
    ) -> None:
        """In the event loop: hand each caller of a committed (or failed) batch its result."""
        if isinstance(outcome, BaseException):
            for p in batch:
                p._resolve(False, outcome)
            return
        self._batches += 1
        self._ops += len(batch)
        self._largest = max(self._largest, len(batch))
        for p, (ok, value) in zip(batch, outcome, strict=True):
            p._resolve(ok, value)
