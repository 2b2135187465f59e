"""Ledger lines sealed after the fence, on every engine (`supervisor.store.sealing`).

A turn's ending comes to the store with its exec and evidence entries unsealed; the engine seals
them only when the ending's fence held, in the transaction that commits it. What a user of the
ledgers would notice is checked on real files and a real store: a refused ending (a stale claim,
in a batch of endings or alone) never takes a seq, so the next ending continues the chain where
it stood; an ending whose transaction fails after sealing takes its lines back; and the store
refuses a line that does not continue its chain.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from ledger import SealedLine, SessionLedgers
from ledger.pending import PendingLines
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import StaleClaimError
from supervisor.store.postgres import open_postgres_store
from supervisor.store.protocol import NewSession, TurnEnding, TurnStore
from supervisor.store.sqlite import open_sqlite_store
from tests.supervisor.store.conformance import (
    LEASE_MS,
    SHORT_LEASE_MS,
    attempt,
    claimed,
    expire,
    instruction,
)
from tests.supervisor.store.pg_cluster import database_for

SID = "SES-sealing"
DONE = TurnEnding(state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok")


@dataclass
class Engine:
    """One engine over a test's storage, and a way to run raw SQL on it."""

    open: Callable[[], object]
    sql: Callable[[str], object]


async def _sqlite_sql(path: Path, statement: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(statement)
    finally:
        conn.close()


async def _pg_sql(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


_REFUSE_LINES = {
    "sqlite": (
        "CREATE TRIGGER refuse_lines BEFORE INSERT ON ledger_lines"
        " BEGIN SELECT RAISE(ABORT, 'the disk said no'); END;"
    ),
    "postgres": (
        "CREATE FUNCTION refuse_lines() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'the disk said no'; END$$;"
        " CREATE TRIGGER refuse_lines BEFORE INSERT ON ledger_lines"
        " FOR EACH ROW EXECUTE FUNCTION refuse_lines();"
    ),
}
_ALLOW_LINES = {
    "sqlite": "DROP TRIGGER refuse_lines;",
    "postgres": "DROP TRIGGER refuse_lines ON ledger_lines;",
}


@pytest.fixture(params=["sqlite", "sqlite-threaded", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Engine]:
    name: str = request.param
    if name == "postgres":
        dsn = database_for(tmp_path)
        return "postgres", Engine(lambda: open_postgres_store(dsn), lambda s: _pg_sql(dsn, s))
    path = tmp_path / "state" / "turns.sqlite3"
    inline = 0.0 if name == "sqlite-threaded" else 0.001
    return "sqlite", Engine(
        lambda: open_sqlite_store(path, inline_limit_s=inline), lambda s: _sqlite_sql(path, s)
    )


@asynccontextmanager
async def _opened(
    engine: Engine, tmp_path: Path
) -> AsyncIterator[tuple[TurnStore, SessionLedgers]]:
    ledgers = SessionLedgers.create(root=tmp_path / "root", tier="default", session_id=SID)
    try:
        async with engine.open() as store:  # type: ignore[attr-defined]
            await store.open_session(NewSession(session_id=SID, package_id="demo"))
            yield store, ledgers
    finally:
        ledgers.close()


def _entries(ledgers: SessionLedgers, number: int) -> PendingLines:
    return ledgers.turn_lines(
        turn_number=number, query_hash="q" * 64, result_hash="r" * 64, status="succeeded"
    )


async def _kept(store: TurnStore, ledgers: SessionLedgers) -> list[SealedLine]:
    """The lines the store keeps for the session, in (ledger, seq) order."""
    kept = await store.ledger_lines([ledgers.exec.ledger_id, ledgers.evidence.ledger_id])
    return sorted(kept, key=lambda x: (x.ledger_id, x.seq))


async def test_a_stale_ending_never_takes_a_seq(engine: tuple[str, Engine], tmp_path: Path) -> None:
    """A daemon whose claim was taken over ends the turn late: refused, its entries were never
    sealed (the chains did not move, the store keeps nothing), and the new owner's ending takes
    the seqs that follow the head."""
    async with _opened(engine[1], tmp_path) as (store, ledgers):
        accepted = await store.accept(instruction(SID), claim_for="A", lease_ms=SHORT_LEASE_MS)
        assert accepted.claim is not None
        old = await store.start_attempt(accepted.claim, attempt(1))
        await expire()
        (new,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
        heads = (ledgers.exec.head, ledgers.evidence.head)
        late = _entries(ledgers, 1)
        with pytest.raises(StaleClaimError):
            await store.finish(old, DONE, [attempt(1)], ledger_lines=late)
        assert late.lines == ()
        assert (ledgers.exec.head, ledgers.evidence.head) == heads
        assert await _kept(store, ledgers) == []
        ending = _entries(ledgers, 1)
        await store.finish(new, DONE, [attempt(1)], ledger_lines=ending)
        exec_line, evidence_line = ending.lines
        assert (exec_line.seq, exec_line.previous_hash) == (heads[0][0] + 1, heads[0][1])
        assert (evidence_line.seq, evidence_line.previous_hash) == (heads[1][0] + 1, heads[1][1])
        assert await _kept(store, ledgers) == sorted(
            ending.lines, key=lambda x: (x.ledger_id, x.seq)
        )


async def test_a_stale_ending_in_a_pass_leaves_no_hole(
    engine: tuple[str, Engine], tmp_path: Path
) -> None:
    """Five endings queued in one pass, the middle one under a lost claim: the four others
    commit with contiguous seqs, the refused one is never sealed."""
    async with _opened(engine[1], tmp_path) as (store, ledgers):
        claims = [await claimed(store, instruction(SID)) for _ in range(5)]
        claims = [await store.start_attempt(c, attempt(1)) for c in claims]
        stale = claims[2]
        # another daemon took turn 3 meanwhile (its lease expired and it was claimed again)
        await store.release(stale)
        (taken,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
        assert taken.turn_id == stale.turn_id
        start = ledgers.exec.head[0]
        entries = [_entries(ledgers, n) for n in range(1, 6)]
        pending = [
            store.finish_soon(c, DONE, [attempt(1)], ledger_lines=e)
            for c, e in zip(claims, entries, strict=True)
        ]
        outcomes: list[TurnState | None] = []
        for p in pending:
            try:
                outcomes.append((await p.result()).state)
            except StaleClaimError:
                outcomes.append(None)
        assert outcomes == [TurnState.SUCCEEDED] * 2 + [None] + [TurnState.SUCCEEDED] * 2
        assert entries[2].lines == ()
        seqs = [e.lines[0].seq for e in entries if e.lines]
        assert seqs == [start + 1, start + 2, start + 3, start + 4]
        kept = [x for x in await _kept(store, ledgers) if x.ledger_id.endswith("/exec")]
        assert [x.seq for x in kept] == seqs


async def test_an_ending_whose_commit_fails_takes_its_lines_back(
    engine: tuple[str, Engine], tmp_path: Path
) -> None:
    """The store fails the transaction after the lines were sealed (a trigger refuses the
    ledger lines): the turn stays running, its lines leave the chains, and once the store works
    again the same ending commits with the same seqs."""
    name, eng = engine
    async with _opened(eng, tmp_path) as (store, ledgers):
        claim = await store.start_attempt(await claimed(store, instruction(SID)), attempt(1))
        heads = (ledgers.exec.head, ledgers.evidence.head)
        await eng.sql(_REFUSE_LINES[name])  # type: ignore[misc]
        ending = _entries(ledgers, 1)
        with pytest.raises(Exception, match="the disk said no"):
            await store.finish(claim, DONE, [attempt(1)], ledger_lines=ending)
        assert not ending.lines
        assert (ledgers.exec.head, ledgers.evidence.head) == heads
        assert (await store.get_turn(claim.turn_id)).state is TurnState.RUNNING
        await eng.sql(_ALLOW_LINES[name])  # type: ignore[misc]
        done = await store.finish(claim, DONE, [attempt(1)], ledger_lines=ending)
        assert done.state is TurnState.SUCCEEDED
        assert ending.lines[0].seq == heads[0][0] + 1


async def test_the_store_refuses_a_line_that_does_not_link(
    engine: tuple[str, Engine], tmp_path: Path
) -> None:
    """A line whose previous hash is not its kept predecessor's (a forked chain) is refused and
    the ending with it: nothing is written. PostgreSQL, the fleet's ledger of record, checks
    the link; every engine refuses a different line at a kept seq."""
    name, eng = engine
    async with _opened(eng, tmp_path) as (store, ledgers):
        first = _entries(ledgers, 1)
        claim = await store.start_attempt(await claimed(store, instruction(SID)), attempt(1))
        await store.finish(claim, DONE, [attempt(1)], ledger_lines=first)
        kept = await _kept(store, ledgers)
        exec_line = first.lines[0]
        forged = SealedLine(
            exec_line.ledger_id,
            exec_line.seq + 1,
            "f" * 64,
            b'{"forged":true}\n',
            previous_hash="0" * 64,
        )
        other = await store.start_attempt(await claimed(store, instruction(SID)), attempt(1))
        forked = SealedLine(exec_line.ledger_id, exec_line.seq, "e" * 64, b"{}\n")
        with pytest.raises(ValueError, match="different line at seq"):
            await store.finish(other, DONE, [attempt(1)], ledger_lines=[forked])
        if name == "postgres":
            with pytest.raises(ValueError, match="does not continue the chain"):
                await store.finish(other, DONE, [attempt(1)], ledger_lines=[forged])
        assert (await store.get_turn(other.turn_id)).state is TurnState.RUNNING
        assert await _kept(store, ledgers) == kept
