"""What only the SQLite engine promises: its file, its schema version, its committer, a crash."""

from __future__ import annotations

import dataclasses
import logging
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import anyio
import msgspec
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import supervisor.store.sqlite.writer as engine_module
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import IntakeClosedError, SessionClosedError, UnknownSessionError
from supervisor.store.grouping import Accept, Finish
from supervisor.store.protocol import (
    Accepted,
    NewSession,
    NewTurn,
    TurnEnding,
    TurnRecord,
    TurnStore,
)
from supervisor.store.sqlite import (
    SCHEMA_VERSION,
    SchemaVersionError,
    SqliteTurnStore,
    batches,
    open_sqlite_store,
)
from supervisor.store.sqlite.schema import open_connections
from supervisor.wire.turn_spec import InstructionSpec
from tests.turn_requests import READ_SPEC


def _turn(i: int = 0) -> NewTurn:
    return NewTurn(session_id="S1", spec=msgspec.structs.replace(READ_SPEC, parameters={"i": i}))


async def _with_session(path: Path) -> None:
    async with open_sqlite_store(path) as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))


async def test_is_a_turn_store(tmp_path: Path) -> None:
    """SqliteTurnStore satisfies the TurnStore protocol (checked by mypy) and closes unstarted."""
    store: TurnStore = SqliteTurnStore(tmp_path / "turns.sqlite3")
    await store.aclose()
    with pytest.raises(IntakeClosedError):
        await store.counts()


async def test_wal_and_full_sync(tmp_path: Path) -> None:
    """The file is in WAL mode and both connections sync fully (a commit survives power loss)."""
    path = tmp_path / "state" / "turns.sqlite3"
    await _with_session(path)
    writer, reader = open_connections(path)
    try:
        assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert reader.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert reader.execute("PRAGMA query_only").fetchone()[0] == 1
    finally:
        writer.close()
        reader.close()


async def test_newer_schema_refused(tmp_path: Path) -> None:
    """A file written by a newer schema is refused, naming the file, both versions, what to do."""
    path = tmp_path / "turns.sqlite3"
    await _with_session(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'turn_store_schema'")
    conn.close()
    with pytest.raises(SchemaVersionError, match=rf"{path} has schema version 99, newer") as err:
        async with open_sqlite_store(path):
            pass
    assert (err.value.found, err.value.supported) == (99, SCHEMA_VERSION)
    assert "Upgrade hunter" in str(err.value)


async def test_version_1_file_is_upgraded(tmp_path: Path) -> None:
    """A file of schema 1 (before ledger lines rode in the ending's commit, and sessions had
    a tenant) is upgraded in place on open; its sessions stay and the new parts work."""
    path = tmp_path / "turns.sqlite3"
    await _with_session(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE ledger_lines")
        conn.execute("ALTER TABLE sessions DROP COLUMN tenant")
        conn.execute("ALTER TABLE sessions DROP COLUMN priority")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'turn_store_schema'")
    conn.close()
    async with open_sqlite_store(path) as store:
        assert [(s.session_id, s.tenant) for s in await store.list_sessions()] == [("S1", None)]
        assert await store.ledger_lines(["S1/exec"]) == []
        await store.open_session(NewSession(session_id="S2", package_id="demo", tenant="t"))
        assert (await store.get_session("S2")).tenant == "t"
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'turn_store_schema'").fetchone()
    conn.close()
    assert int(version[0]) == SCHEMA_VERSION == 5


async def test_version_3_ledger_lines_move_into_rowid_order_and_stay(tmp_path: Path) -> None:
    """A file of schema 3 kept its ledger lines clustered by ledger (``WITHOUT ROWID``); the
    upgrade moves them into a rowid table with the same key, every line kept, read back in
    seq order, trimmed as before, and a line again at a kept seq still refused if different."""
    path = tmp_path / "turns.sqlite3"
    await _with_session(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE ledger_lines")
        conn.execute(
            "CREATE TABLE ledger_lines(ledger_id TEXT NOT NULL, seq INTEGER NOT NULL,"
            " entry_hash TEXT NOT NULL, line BLOB NOT NULL, PRIMARY KEY(ledger_id, seq))"
            " WITHOUT ROWID"
        )
        conn.executemany(
            "INSERT INTO ledger_lines VALUES (?, ?, ?, ?)",
            [
                (f"S1/{kind}", seq, f"h{seq}", b'{"seq":%d}' % seq)
                for seq in (3, 1, 2)
                for kind in ("exec", "evidence")
            ],
        )
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'turn_store_schema'")
    conn.close()
    async with open_sqlite_store(path) as store:
        kept = await store.ledger_lines(["S1/exec", "S1/evidence"])
        assert [(x.ledger_id, x.seq, x.entry_hash) for x in kept] == [
            (f"S1/{kind}", seq, f"h{seq}") for kind in ("exec", "evidence") for seq in (1, 2, 3)
        ]
        assert await store.trim_ledger_lines({"S1/exec": 2}) == 2
        assert [x.seq for x in await store.ledger_lines(["S1/exec"])] == [3]
    conn = sqlite3.connect(path)
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'ledger_lines'").fetchone()
    version = conn.execute("SELECT value FROM meta WHERE key = 'turn_store_schema'").fetchone()
    with pytest.raises(sqlite3.IntegrityError), conn:  # the key still holds
        conn.execute("INSERT INTO ledger_lines VALUES ('S1/exec', 3, 'other', x'00')")
    conn.close()
    assert "WITHOUT ROWID" not in sql
    assert int(version[0]) == SCHEMA_VERSION


_V4_TURNS: Final = """CREATE TABLE turns_v4(
    turn_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    turn_number INTEGER NOT NULL, kind TEXT NOT NULL, command_type TEXT, spec BLOB NOT NULL,
    idempotency_key TEXT, state TEXT NOT NULL, round INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0, accepted_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL, next_attempt_us INTEGER, finished_us INTEGER, verdict TEXT,
    reason_code TEXT, reason TEXT, fault_type TEXT, result BLOB, owner TEXT,
    token INTEGER NOT NULL DEFAULT 0, lease_until_us INTEGER,
    UNIQUE(session_id, turn_number),
    UNIQUE(session_id, idempotency_key)
)"""


def _as_schema_4(path: Path, *, sequence: int) -> None:
    """Give the store at *path* the layout of schema 4: ``turns`` under the two constraints led
    by the session, no session bounds, and an id sequence at *sequence* (ids given out to rows
    that are gone)."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(_V4_TURNS)
        conn.execute("INSERT INTO turns_v4 SELECT * FROM turns")
        conn.execute("DROP TABLE turns")
        conn.execute("ALTER TABLE turns_v4 RENAME TO turns")
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'turns'", (sequence,))
        conn.execute("CREATE INDEX turns_unfinished ON turns(turn_id) WHERE state = 'accepted'")
        conn.execute("CREATE INDEX turns_by_state ON turns(state, turn_id)")
        conn.execute("ALTER TABLE sessions DROP COLUMN first_turn_id")
        conn.execute("ALTER TABLE sessions DROP COLUMN last_turn_id")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'turn_store_schema'")
    conn.close()


async def test_version_4_turns_lose_the_indexes_led_by_the_session(tmp_path: Path) -> None:
    """A file of schema 4 is upgraded in place: every turn kept with its id and attempts, each
    session's turns listed as before, a key still finds its turn, new ids go on after the
    highest ever given out, and no index of ``turns`` is led by the session any more."""
    path = tmp_path / "turns.sqlite3"
    async with open_sqlite_store(path) as store:
        for name in ("S1", "S2"):
            await store.open_session(NewSession(session_id=name, package_id="demo"))
        ids: dict[str, list[int]] = {"S1": [], "S2": []}
        claims = []
        for i in range(6):
            name = ("S1", "S2")[i % 2]
            new = NewTurn(session_id=name, spec=_turn(i).spec, idempotency_key=f"key-{i}")
            accepted = await store.accept(new, claim_for="A")
            ids[name].append(accepted.turn.turn_id)
            claims.append(accepted.claim)
        assert claims[0] is not None
        ended = await store.finish(claims[0], TurnEnding(state=TurnState.CANCELLED))
    _as_schema_4(path, sequence=100)
    async with open_sqlite_store(path) as store:
        for name, mine in ids.items():
            listed = (await store.list_turns(session_id=name)).turns
            assert [(t.turn_id, t.turn_number) for t in listed] == [
                (x, n) for n, x in enumerate(mine, 1)
            ]
        assert (await store.get_turn(ended.turn_id)).state is TurnState.CANCELLED
        again = await store.accept(
            NewTurn(session_id="S2", spec=_turn(1).spec, idempotency_key="key-1")
        )
        assert (again.created, again.turn.turn_id) == (False, ids["S2"][0])
        later = (await store.accept(_turn(9))).turn
        assert (later.turn_id, later.turn_number) == (101, 4)
        assert [t.turn_id for t in (await store.list_turns(session_id="S1")).turns] == [
            *ids["S1"],
            101,
        ]
    conn = sqlite3.connect(path)
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'turns'"
    ).fetchall()
    version = conn.execute("SELECT value FROM meta WHERE key = 'turn_store_schema'").fetchone()
    conn.close()
    assert sorted(name for name, _ in indexes) == [
        "turns_by_key",
        "turns_by_state",
        "turns_unfinished",
    ]
    assert not any("(session_id" in str(sql) for _, sql in indexes)
    assert int(version[0]) == SCHEMA_VERSION


async def test_foreign_file_refused(tmp_path: Path) -> None:
    """A SQLite file with other tables (the old intake) is refused, not written into."""
    path = tmp_path / "intake.sqlite3"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.close()
    with pytest.raises(SchemaVersionError, match="not a turn store") as err:
        async with open_sqlite_store(path):
            pass
    assert err.value.found is None


async def test_calls_before_run_are_an_error(tmp_path: Path) -> None:
    """Calling a store whose committer never started raises RuntimeError saying what to do."""
    store = SqliteTurnStore(tmp_path / "turns.sqlite3")
    with pytest.raises(RuntimeError, match=r"start its run\(\)"):
        await store.accept(_turn())
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        with pytest.raises(RuntimeError, match="already called"):
            await store.run()
        await store.aclose()


async def test_body_errors_are_not_wrapped(tmp_path: Path) -> None:
    """An error raised inside `open_sqlite_store` comes out as itself, not in a group."""
    with pytest.raises(KeyError, match="mine"):
        async with open_sqlite_store(tmp_path / "turns.sqlite3"):
            raise KeyError("mine")


async def test_group_commit(tmp_path: Path) -> None:
    """Concurrent writes share commits: fewer commits than operations."""
    path = tmp_path / "turns.sqlite3"
    async with open_sqlite_store(path) as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(store.accept, _turn(i))
        stats = store.statistics()
        assert stats.engine == "sqlite"
        assert stats.operations == 201
        assert stats.commits < stats.operations
        assert stats.largest_batch > 1
        assert (await store.get_session("S1")).turns == 200


async def test_cancelled_caller_breaks_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller cancelled as it writes: its write is all or nothing, nothing is logged."""
    caplog.set_level(logging.WARNING)
    async with open_sqlite_store(tmp_path / "turns.sqlite3") as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        with anyio.CancelScope() as scope:
            scope.cancel()  # delivered at the wait, after the write was queued
            await store.accept(_turn(1))
        assert scope.cancelled_caught
        after = await store.accept(_turn(2))
        written = await store.list_turns()
        assert [t.turn_number for t in written.turns] == list(range(1, after.turn.turn_number + 1))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_cancelled_queued_write_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write whose caller was cancelled before its batch started is not written."""
    caplog.set_level(logging.WARNING)
    path = tmp_path / "turns.sqlite3"
    await _with_session(path)
    blocker = sqlite3.connect(path, isolation_level=None)
    scopes: list[anyio.CancelScope] = []

    async def cancelled() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await store.accept(_turn(2))

    try:
        async with open_sqlite_store(path) as store, anyio.create_task_group() as tg:
            blocker.execute("BEGIN IMMEDIATE")  # the committer's first batch waits for it
            tg.start_soon(store.accept, _turn(1))
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(cancelled)  # queued behind the busy committer
            await anyio.wait_all_tasks_blocked()
            scopes[0].cancel()
            await anyio.wait_all_tasks_blocked()
            blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert scopes[0].cancelled_caught
    async with open_sqlite_store(path) as store:
        specs = [t.spec for t in (await store.list_turns()).turns]
        assert [s.parameters["i"] for s in specs if isinstance(s, InstructionSpec)] == [1]
        assert store.statistics().operations == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_aclose_commits_queued_writes(tmp_path: Path) -> None:
    """aclose lets the writes already queued commit; their callers get their turns."""
    path = tmp_path / "turns.sqlite3"
    await _with_session(path)
    numbers: list[int] = []
    store = SqliteTurnStore(path)

    async def accept(i: int) -> None:
        numbers.append((await store.accept(_turn(i))).turn.turn_number)

    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for i in range(20):
            tg.start_soon(accept, i)
        await anyio.wait_all_tasks_blocked()  # every accept has queued its write
        await store.aclose()
    assert sorted(numbers) == list(range(1, 21))
    async with open_sqlite_store(path) as again:
        assert (await again.get_session("S1")).turns == 20


async def test_attempt_extra_is_json(tmp_path: Path) -> None:
    """An attempt's extra is stored as a JSON object (readable by other tools)."""
    path = tmp_path / "turns.sqlite3"
    async with open_sqlite_store(path) as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        accepted = await store.accept(_turn(), claim_for="A")
        assert accepted.claim is not None
        record = AttemptRecord(attempt=1, started_us=1, extra={"signal": 9, "writes": ["a"]})
        await store.start_attempt(accepted.claim, record)
    conn = sqlite3.connect(path)
    try:
        (blob,) = conn.execute("SELECT extra FROM attempts").fetchone()
    finally:
        conn.close()
    assert orjson.loads(blob) == {"signal": 9, "writes": ["a"]}


_CHILD = """
import sys
from pathlib import Path

import anyio

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.store.protocol import NewSession, NewTurn
from supervisor.store.sqlite import open_sqlite_store
from supervisor.wire.turn_spec import InstructionSpec


async def main(path: str) -> None:
    async with open_sqlite_store(Path(path)) as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))

        async def feed(w: int) -> None:
            for i in range(1_000_000):
                spec = InstructionSpec(
                    timeout_ms=1000,
                    command_type=ExecutorCommandType.READ,
                    parameters={"w": w, "i": i},
                )
                new = NewTurn(
                    session_id="S1", spec=spec,
                    idempotency_key=f"{w}-{i}",
                )
                got = await store.accept(new, claim_for="A")
                sys.stdout.write(f"{got.turn.turn_id}\\n")
                sys.stdout.flush()

        async with anyio.create_task_group() as tg:
            for w in range(8):
                tg.start_soon(feed, w)


anyio.run(main, sys.argv[1])
"""


async def test_sigkill_keeps_acknowledged_turns(tmp_path: Path) -> None:
    """A daemon SIGKILLed mid-load loses no acknowledged turn and leaves a sound file."""
    path = tmp_path / "turns.sqlite3"
    acknowledged: set[int] = set()
    with anyio.fail_after(60):
        async with await anyio.open_process(
            [sys.executable, "-c", _CHILD, str(path)], stderr=None
        ) as proc:
            assert proc.stdout is not None
            lines = BufferedByteReceiveStream(proc.stdout)
            while len(acknowledged) < 500:
                acknowledged.add(int(await lines.receive_until(b"\n", 64)))
            proc.send_signal(signal.SIGKILL)
            assert await proc.wait() == -signal.SIGKILL
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    async with open_sqlite_store(path) as store:
        for turn_id in sorted(acknowledged):
            turn = await store.get_turn(turn_id)
            assert turn.owner == "A"
        assert (await store.get_session("S1")).turns >= len(acknowledged)
        recovered = await store.recover("B", lease_ms=1_000)
        assert {c.turn_id for c in recovered} >= acknowledged
        assert all(c.token == 2 for c in recovered)


async def test_recover_takes_every_unfinished_turn_whoever_held_it(tmp_path: Path) -> None:
    """The embedded engine has one daemon: a restarted daemon (a new owner id) takes back every
    unfinished, non-escalated turn, live leases of its former self included."""
    async with open_sqlite_store(tmp_path / "turns.sqlite3") as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        held = await store.accept(_turn(1), claim_for="old-daemon", lease_ms=60_000)
        assert held.claim is not None
        running = await store.start_attempt(held.claim, AttemptRecord(attempt=1, started_us=1))
        free = (await store.accept(_turn(2))).turn
        got = await store.recover("new-daemon", lease_ms=60_000)
        assert [(c.turn_id, c.owner, c.token) for c in got] == [
            (running.turn_id, "new-daemon", 2),
            (free.turn_id, "new-daemon", 1),
        ]


async def test_endings_queued_together_run_as_one_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight endings queued in one pass are written by one `finish_many` call (one statement
    per step for all of them), in one commit; a start queued before one of them runs first."""
    calls: list[int] = []
    real = batches.finish_many

    def spy(conn: sqlite3.Connection, items: Sequence[Finish]) -> list[TurnRecord | Exception]:
        calls.append(len(items))
        return real(conn, items)

    monkeypatch.setattr(engine_module, "finish_many", spy)
    # A result and attempts shaped like an instruction turn's (nested objects, lists, nulls):
    # the records built without reading back must equal what the store reads back.
    done = TurnEnding(
        state=TurnState.SUCCEEDED,
        verdict="SUCCEED",
        reason_code="ok",
        result={
            "executor_id": "ex-1",
            "detail": None,
            "output": {"rows": [1, 2, {"x": True}], "text": "hi"},
            "last_instruction": {"parameters": {}, "timeout_ms": 100},
        },
    )
    async with open_sqlite_store(tmp_path / "turns.sqlite3") as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        claims = []
        for i in range(8):
            accepted = await store.accept(_turn(i), claim_for="A")
            assert accepted.claim is not None
            claims.append(accepted.claim)
        commits = store.statistics().commits
        first = AttemptRecord(attempt=1, started_us=1)
        start = store.start_attempt_soon(claims[0], first)
        ended = [
            store.finish_soon(
                c,
                done,
                [AttemptRecord(attempt=1, started_us=1, decision="SUCCEED", extra={"k": [i]})],
                started=None if i == 0 else first,
            )
            for i, c in enumerate(claims)
        ]
        await start.result()
        records = [await p.result() for p in ended]
        assert store.statistics().commits == commits + 1
        assert calls == [8]
        assert {r.state for r in records} == {TurnState.SUCCEEDED}
        assert records == [await store.get_turn(c.turn_id) for c in claims]


async def test_accepts_arriving_together_run_as_one_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight accepts arriving in one pass are written by one `accept_many` call, numbered
    1..8 in the order they arrived, in one commit."""
    calls: list[int] = []
    real = batches.accept_many

    def spy(conn: sqlite3.Connection, items: Sequence[Accept]) -> list[Accepted | Exception]:
        calls.append(len(items))
        return real(conn, items)

    monkeypatch.setattr(engine_module, "accept_many", spy)
    async with open_sqlite_store(tmp_path / "turns.sqlite3") as store:
        await store.open_session(NewSession(session_id="S1", package_id="demo"))
        commits = store.statistics().commits
        got: dict[int, Accepted] = {}

        async def one(i: int) -> None:
            got[i] = await store.accept(_turn(i), claim_for="A")

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        assert store.statistics().commits == commits + 1
    assert calls == [8]
    assert [got[i].turn.turn_number for i in range(8)] == list(range(1, 9))


async def test_a_pass_over_many_sessions_numbers_each_and_refuses_only_the_closed(
    tmp_path: Path,
) -> None:
    """Accepts of one pass spread over open, closed and unknown sessions: the open sessions'
    turns are numbered from their own count in arrival order with the ids the store keeps;
    the closed and the unknown session's accepts get their errors, and nothing of theirs is
    written."""
    async with open_sqlite_store(tmp_path / "turns.sqlite3") as store:
        for sid in ("A", "B", "C"):
            await store.open_session(NewSession(session_id=sid, package_id="demo"))
        await store.accept(dataclasses.replace(_turn(0), session_id="B"), claim_for="X")
        await store.close_session("C")
        order = ["A", "B", "C", "A", "nope", "B", "A"]
        got: dict[int, Accepted | Exception] = {}

        async def one(i: int, sid: str) -> None:
            try:
                got[i] = await store.accept(
                    dataclasses.replace(_turn(i), session_id=sid), claim_for="X"
                )
            except Exception as exc:
                got[i] = exc

        commits = store.statistics().commits
        async with anyio.create_task_group() as tg:
            for i, sid in enumerate(order):
                tg.start_soon(one, i, sid)
        assert store.statistics().commits == commits + 1  # one pass
        numbers = {
            i: (a.turn.session_id, a.turn.turn_number)
            for i, a in got.items()
            if isinstance(a, Accepted)
        }
        assert numbers == {0: ("A", 1), 1: ("B", 2), 3: ("A", 2), 5: ("B", 3), 6: ("A", 3)}
        assert isinstance(got[2], SessionClosedError)
        assert isinstance(got[4], UnknownSessionError)
        for a in got.values():
            if isinstance(a, Accepted):
                kept = await store.get_turn(a.turn.turn_id)
                assert (kept.session_id, kept.turn_number) == (
                    a.turn.session_id,
                    a.turn.turn_number,
                )
                assert kept.spec == a.turn.spec
        assert (await store.get_session("C")).turns == 0
