"""The PostgreSQL engine beyond the conformance suite: the private cluster, several daemons."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import anyio
import asyncpg
import pytest

from ledger import SealedLine
from sandbox.policy.lifecycle import IllegalTransition, TurnState
from supervisor.errors import SchemaVersionError, StaleClaimError
from supervisor.store.fleet import StaleHomeError
from supervisor.store.postgres import (
    SCHEMA_VERSION,
    SchemaNotMigratedError,
    migrate_database,
    open_postgres_store,
)
from supervisor.store.postgres import schema as pg_schema
from supervisor.store.postgres.ledger_lines import PUT_LINES as _PUT_LINES
from supervisor.store.postgres.ledger_lines import put_ledger_lines
from supervisor.store.protocol import NewSession, TurnEnding, TurnStore
from tests.supervisor.store.conformance import (
    LEASE_MS,
    SHORT_LEASE_MS,
    attempt,
    claimed,
    expire,
    instruction,
    line,
    session,
)
from tests.supervisor.store.pg_cluster import PgCluster, database_for


async def test_private_cluster_is_durable_and_unprivileged(
    pg_cluster: PgCluster, pg_dsn: str
) -> None:
    """The tests' cluster keeps the durability settings on and never runs as root."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("fsync", "synchronous_commit", "full_page_writes", "listen_addresses")
        }
    finally:
        await conn.close()
    assert settings == {
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "listen_addresses": "",
    }
    pid = int((pg_cluster.data / "postmaster.pid").read_text().split()[0])
    assert os.stat(f"/proc/{pid}").st_uid != 0


async def test_two_daemons_never_claim_the_same_turn(pg_dsn: str) -> None:
    """Two stores on one database (two daemons): a turn one claimed is not claimed by the
    other, and concurrent claims split the runnable turns without overlap."""
    async with open_postgres_store(pg_dsn) as a, open_postgres_store(pg_dsn) as b:
        await session(a)
        held = await claimed(a, owner="A")
        assert await b.claim("B", limit=10, lease_ms=LEASE_MS) == []
        ids = {(await b.accept(instruction())).turn.turn_id for _ in range(40)}
        got: dict[str, list[int]] = {"A": [], "B": []}

        async def take(store: TurnStore, owner: str) -> None:
            while claims := await store.claim(owner, limit=3, lease_ms=LEASE_MS):
                got[owner].extend(c.turn_id for c in claims)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, a, "A")
            tg.start_soon(take, b, "B")
        assert not set(got["A"]) & set(got["B"])
        assert set(got["A"]) | set(got["B"]) == ids
        assert held.turn_id not in ids
        assert (await b.get_turn(held.turn_id)).owner == "A"


async def test_claim_skips_rows_locked_by_another_daemon(pg_dsn: str) -> None:
    """A claim passes over a turn whose row another transaction holds locked (SKIP LOCKED)
    instead of waiting for it, and takes it once the lock is gone."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        first, second = (
            (await store.accept(instruction())).turn,
            (await store.accept(instruction())).turn,
        )
        other = await asyncpg.connect(pg_dsn)
        try:
            locked = other.transaction()
            await locked.start()
            await other.execute("SELECT 1 FROM turns WHERE turn_id = $1 FOR UPDATE", first.turn_id)
            with anyio.fail_after(5):
                taken = await store.claim("A", limit=10, lease_ms=LEASE_MS)
            assert [c.turn_id for c in taken] == [second.turn_id]
            await locked.rollback()
        finally:
            await other.close()
        (late,) = await store.claim("B", limit=10, lease_ms=LEASE_MS)
        assert late.turn_id == first.turn_id


async def test_stale_daemon_result_refused(pg_dsn: str) -> None:
    """A daemon paused past its lease cannot record a result once another daemon took the
    turn over; the new owner's ending stands."""
    async with open_postgres_store(pg_dsn) as a, open_postgres_store(pg_dsn) as b:
        await session(a)
        accepted = await a.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
        assert accepted.claim is not None
        old = await a.start_attempt(accepted.claim, attempt(1))
        await expire()
        (new,) = await b.claim("B", limit=1, lease_ms=LEASE_MS)
        assert new.token == old.token + 1
        with pytest.raises(StaleClaimError, match=r"claim of A \(token 1\) is stale"):
            await a.finish(old, TurnEnding(state=TurnState.SUCCEEDED))
        done = await b.finish(new, TurnEnding(state=TurnState.FAILED))
        assert (await a.get_turn(done.turn_id)).state is TurnState.FAILED
        assert a.statistics().stale_writes_refused == 1
        assert a.statistics().engine == "postgres"


async def test_recover_leaves_live_claims_of_other_daemons(pg_dsn: str) -> None:
    """recover takes back the owner's own turns, turns nobody holds and expired leases, never
    another daemon's live claim."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        mine = await claimed(store, owner="A")
        theirs = await claimed(store, owner="B")
        free = (await store.accept(instruction())).turn
        lapsed = await store.accept(instruction(), claim_for="C", lease_ms=SHORT_LEASE_MS)
        assert lapsed.claim is not None
        await expire()
        got = await store.recover("A", lease_ms=LEASE_MS)
        assert [c.turn_id for c in got] == [mine.turn_id, free.turn_id, lapsed.turn.turn_id]
        assert all(c.owner == "A" for c in got)
        assert (await store.get_turn(theirs.turn_id)).owner == "B"


async def test_schema_version_checks(pg_dsn: str) -> None:
    """A database not yet migrated, one of a newer hunter and one holding foreign tables are
    each refused with a message saying what to do; migrating makes it usable."""
    with pytest.raises(SchemaNotMigratedError, match=r"Run `hunter store migrate`"):
        async with open_postgres_store(pg_dsn, migrate=False):
            pass
    assert await migrate_database(pg_dsn) == (None, SCHEMA_VERSION)
    assert await migrate_database(pg_dsn) == (SCHEMA_VERSION, SCHEMA_VERSION)
    async with open_postgres_store(pg_dsn, migrate=False) as store:
        await session(store)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("UPDATE hunter_meta SET value = '99' WHERE key = 'turn_store_schema'")
    finally:
        await conn.close()
    for migrate in (False, True):
        with pytest.raises(SchemaVersionError, match=r"schema version 99, newer than the") as err:
            async with open_postgres_store(pg_dsn, migrate=migrate):
                pass
        assert (err.value.found, err.value.supported) == (99, SCHEMA_VERSION)


async def test_version_2_database_is_upgraded(pg_dsn: str) -> None:
    """A database of schema 2 (sessions without a tenant) is migrated to 3: its sessions stay,
    with no tenant or priority, and new sessions keep theirs."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(pg_schema._MIGRATIONS[0] + pg_schema._MIGRATIONS[1])
        await conn.execute(
            "INSERT INTO hunter_meta(key, value) VALUES ('turn_store_schema', '2');"
            "INSERT INTO sessions(session_id, package_id, tier, state, opened_us)"
            " VALUES ('OLD', 'demo', 'default', 'open', 1)"
        )
    finally:
        await conn.close()
    assert await migrate_database(pg_dsn) == (2, SCHEMA_VERSION)
    async with open_postgres_store(pg_dsn, migrate=False) as store:
        await store.open_session(NewSession(session_id="NEW", package_id="demo", tenant="t"))
        got = {s.session_id: (s.tenant, s.priority) for s in await store.list_sessions()}
    assert got == {"OLD": (None, None), "NEW": ("t", None)}


async def test_foreign_tables_refused(pg_cluster: PgCluster, tmp_path: Path) -> None:
    """A database whose tables are not a turn store is refused, never written into."""
    dsn = database_for(tmp_path)
    pg_cluster.psql("CREATE TABLE invoices(id INT)", database=dsn.split("/")[3].split("?")[0])
    with pytest.raises(SchemaVersionError, match="no turn store schema version") as err:
        async with open_postgres_store(dsn):
            pass
    assert err.value.found is None
    assert "as postgres" in str(err.value.path)


async def test_a_turn_costs_one_statement_to_accept_and_one_to_finish(pg_dsn: str) -> None:
    """Accept (counter, insert), start and retry are one statement each; finish is two: the
    fenced ending (fence, attempts with the deferred start, the ending), then both ledger lines
    and their heads, sealed only once the fence held. What finish returns is what a read gives
    back, and the lines are kept."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        ending = TurnEnding(state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok")
        trips = []
        for seq in (1, 2):  # the first turn also pays asyncpg's one-off type look-ups
            await anyio.sleep(0.05)  # asyncpg reports a query to the counter just after it
            before = store.statistics().round_trips
            claim = await claimed(store)
            await anyio.sleep(0.05)
            middle = store.statistics().round_trips
            lines = (line("S1/exec", seq), line("S1/evidence", seq))
            done = await store.finish(
                claim,
                ending,
                [attempt(1, decision="SUCCEED")],
                ledger_lines=lines,
                started=attempt(1),
            )
            await anyio.sleep(0.05)
            trips.append((middle - before, store.statistics().round_trips - middle))
        # one statement (which also reads the transaction id), plus BEGIN and COMMIT; finish
        # one more: its lines are sealed after the fence held, then kept
        assert trips[1] == (3, 4)
        claim = await claimed(store)
        await anyio.sleep(0.05)  # asyncpg reports a query to the counter just after it
        before = store.statistics().round_trips
        running = await store.start_attempt(claim, attempt(1))  # a start not deferred
        await anyio.sleep(0.05)
        started_trips = store.statistics().round_trips - before
        before = store.statistics().round_trips
        waiting = await store.record_attempt(
            running, attempt(1, decision="RETRY"), next_attempt_us=1
        )
        await anyio.sleep(0.05)
        assert (started_trips, store.statistics().round_trips - before) == (3, 3)
        assert running.turn.state is TurnState.RUNNING
        assert waiting.turn == await store.get_turn(claim.turn_id)
        assert waiting.turn.state is TurnState.WAITING_RETRY
        assert [a.decision for a in waiting.turn.attempts] == ["RETRY"]
        assert done == await store.get_turn(done.turn_id)
        assert [a.decision for a in done.attempts] == ["SUCCEED"]
        kept = await store.ledger_lines(["S1/exec", "S1/evidence"])
        assert {(x.ledger_id, x.seq) for x in kept} == {
            (f"S1/{k}", n) for k in ("exec", "evidence") for n in (1, 2)
        }


async def test_a_pass_of_accepts_and_of_endings_costs_a_statement_or_two(pg_dsn: str) -> None:
    """Twenty accepts queued in one pass (two sessions) are one statement, and their twenty
    endings two (the fenced endings, then the lines sealed for those whose fence held): BEGIN,
    the statements, COMMIT, however many turns.
    Each turn gets the next number of its session, each ending its own record, each ledger
    its lines and its head."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        await session(store, "S2")
        warm = await claimed(store)  # asyncpg's one-off type look-ups
        await store.finish(warm, TurnEnding(state=TurnState.TERMINATED))
        await anyio.sleep(0.05)  # asyncpg reports a query to the counter just after it
        before = store.statistics().round_trips
        queued = [
            store.accept_soon(
                instruction("S1" if i % 2 else "S2"), claim_for="A", lease_ms=LEASE_MS
            )
            for i in range(20)
        ]
        claims = []
        for pending in queued:
            got = await pending.result()
            assert got.claim is not None
            claims.append(got.claim)
        await anyio.sleep(0.05)
        accept_trips = store.statistics().round_trips - before
        numbers = sorted((c.turn.session_id, c.turn.turn_number) for c in claims)
        assert numbers == sorted(
            [("S1", n) for n in range(2, 12)] + [("S2", n) for n in range(1, 11)]
        )
        done = TurnEnding(state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok")
        seqs = {"S1": 0, "S2": 0}
        endings = []
        for claim in claims:
            sid = claim.turn.session_id
            seqs[sid] += 1
            lines = [line(f"{sid}/exec", seqs[sid]), line(f"{sid}/evidence", seqs[sid])]
            endings.append(
                store.finish_soon(
                    claim,
                    replace(done, result={"turn": claim.turn_id}),
                    [attempt(1, decision="SUCCEED")],
                    ledger_lines=lines,
                    started=attempt(1),
                )
            )
        before = store.statistics().round_trips
        records = [await pending.result() for pending in endings]
        await anyio.sleep(0.05)
        # the endings' lines: one more statement for the pass, after the fences held
        assert (accept_trips, store.statistics().round_trips - before) == (3, 4)
        for claim, record in zip(claims, records, strict=True):
            assert record == await store.get_turn(claim.turn_id)
            assert record.state is TurnState.SUCCEEDED
            assert record.result == {"turn": claim.turn_id}
            assert [a.decision for a in record.attempts] == ["SUCCEED"]
        heads = {h.ledger_id: h.seq for h in await store.ledger_heads()}
        assert heads == {f"{s}/{k}": 10 for s in ("S1", "S2") for k in ("exec", "evidence")}
        kept = await store.ledger_lines(["S1/exec"])
        assert [x.seq for x in kept] == list(range(1, 11))


async def test_endings_in_one_statement_refuse_a_stale_home_alone(pg_dsn: str) -> None:
    """Among endings queued together, those whose session another daemon homes are refused
    (StaleHomeError) and write nothing; the others commit."""
    async with open_postgres_store(pg_dsn) as a, open_postgres_store(pg_dsn) as b:
        await session(a)
        await session(a, "S2")
        claims = [await claimed(a, instruction("S1" if i % 2 else "S2")) for i in range(6)]
        await b.home_session("S2", "B", lease_ms=LEASE_MS)
        ending = TurnEnding(state=TurnState.TERMINATED)
        seqs = {"S1": 0, "S2": 0}
        pending = []
        for claim in claims:
            sid = claim.turn.session_id
            seqs[sid] += 1
            pending.append(
                a.finish_soon(claim, ending, ledger_lines=[line(f"{sid}/exec", seqs[sid])])
            )
        for claim, item in zip(claims, pending, strict=True):
            if claim.turn.session_id == "S2":
                with pytest.raises(StaleHomeError):
                    await item.result()
                assert (await a.get_turn(claim.turn_id)).state is TurnState.ACCEPTED
            else:
                assert (await item.result()).state is TurnState.TERMINATED
        assert await a.ledger_lines(["S2/exec"]) == []
        assert [x.seq for x in await a.ledger_lines(["S1/exec"])] == [1, 2, 3]


async def test_the_one_statement_finish_refuses_what_the_long_way_refuses(pg_dsn: str) -> None:
    """A finish the one statement cannot make writes nothing and gets the precise error: a
    claim already released, an illegal move, a session homed by another daemon."""
    async with open_postgres_store(pg_dsn) as a, open_postgres_store(pg_dsn) as b:
        await session(a)
        first = await claimed(a)
        await a.finish(first, TurnEnding(state=TurnState.TERMINATED))
        with pytest.raises(StaleClaimError):
            await a.finish(first, TurnEnding(state=TurnState.SUCCEEDED))
        claim = await claimed(a)
        with pytest.raises(IllegalTransition):  # accepted -> failed needs an attempt first
            await a.finish(claim, TurnEnding(state=TurnState.FAILED))
        await b.home_session("S1", "B", lease_ms=LEASE_MS)
        with pytest.raises(StaleHomeError):
            await a.finish(
                claim, TurnEnding(state=TurnState.TERMINATED), ledger_lines=[line("S1/exec", 1)]
            )
        assert (await a.get_turn(claim.turn_id)).state is TurnState.ACCEPTED
        assert await a.ledger_lines(["S1/exec"]) == []


async def test_a_transaction_the_server_never_recorded_did_not_commit(pg_dsn: str) -> None:
    """After a lost answer the engine asks the server whether its transaction committed; an id
    the server does not know (after a crash: "transaction ID ... is in the future") is a
    transaction that did not commit, so its batch runs again instead of failing the writes."""
    async with open_postgres_store(pg_dsn) as store:
        conn = await asyncpg.connect(pg_dsn)
        try:
            committed = int(await conn.fetchval("SELECT txid_current()"))
        finally:
            await conn.close()
        assert await store._writer.committed(committed) is True
        assert await store._writer.committed(committed + 1_000_000) is False


def _plan_nodes(plan: object) -> list[dict[str, object]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, depth first."""
    found: list[dict[str, object]] = []
    stack: list[object] = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if "Node Type" in node:
                found.append(node)
            stack.extend(node.values())
    return found


async def test_keeping_lines_never_scans_every_kept_line(pg_dsn: str) -> None:
    """A long ledger (20,000 kept lines) and two new lines: the statement that keeps them reads
    their neighbours through the primary key, in the plan PostgreSQL picks for this call and in
    the generic plan a prepared statement falls back to; no plan reads every kept line (which
    made the cost of keeping a line grow with the ledger). The lines are kept, and a fork is
    still refused."""
    async with open_postgres_store(pg_dsn):
        pass  # the schema
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            "INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line)"
            " SELECT 'L/exec', n, 'h' || n, '\\x00'::bytea FROM generate_series(1, 20000) n"
        )
        await conn.execute("ANALYZE ledger_lines")
        new = [
            SealedLine("L/exec", 20001, "h20001", b"{}", previous_hash="h20000"),
            SealedLine("L/exec", 20002, "h20002", b"{}", previous_hash="h20001"),
        ]
        args = (
            [x.ledger_id for x in new],
            [x.seq for x in new],
            [x.entry_hash for x in new],
            [x.line for x in new],
            [x.previous_hash for x in new],
        )
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + _PUT_LINES, *args))
            scans = [
                n
                for n in _plan_nodes(plan)
                if n.get("Relation Name") == "ledger_lines" and n["Node Type"] != "ModifyTable"
            ]
            assert scans, (mode, plan)
            assert all(n["Node Type"] in {"Index Scan", "Index Only Scan"} for n in scans), (
                mode,
                [n["Node Type"] for n in scans],
            )
        await conn.execute("RESET plan_cache_mode")
        assert await put_ledger_lines(conn, new) == 2
        assert await conn.fetchval("SELECT seq FROM ledger_heads WHERE ledger_id = 'L/exec'") == (
            20002
        )
        with pytest.raises(ValueError, match="different line"):
            await put_ledger_lines(
                conn, [SealedLine("L/exec", 20002, "other", b"{}", previous_hash="h20001")]
            )
    finally:
        await conn.close()
