"""The shared engine's fleet rules (`supervisor.store.fleet`) on the private PostgreSQL cluster:
session homes fence ledger writes, heads are anchored, heartbeats list daemons, a resolution
asked of a home waits for it, and a turn nobody holds wakes the other daemons."""

from __future__ import annotations

import anyio
import pytest

from sandbox.policy.lifecycle import TurnState
from supervisor.errors import NotEscalatedError, StoreIntegrityError
from supervisor.store.fleet import StaleHomeError
from supervisor.store.postgres import open_postgres_store
from supervisor.store.protocol import Resolution, TurnEnding
from tests.supervisor.store.conformance import (
    LEASE_MS,
    SHORT_LEASE_MS,
    attempt,
    claimed,
    escalated,
    expire,
    instruction,
    line,
    session,
)
from tests.supervisor.store.pg_cluster import PgCluster


async def test_a_session_has_one_home_and_a_lapsed_home_is_taken_over(pg_dsn: str) -> None:
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        first = await store.home_session("S1", "A", lease_ms=SHORT_LEASE_MS)
        assert (first.owner, first.token) == ("A", 1)
        await expire()
        (taken,) = await store.claim_homes("B", lease_ms=LEASE_MS, limit=10, packages=None)
        assert (taken.session_id, taken.owner, taken.token) == ("S1", "B", 2)
        # A's renewal finds the home gone; B's keeps it
        assert await store.renew_homes([first], lease_ms=LEASE_MS) == []
        assert [h.owner for h in await store.renew_homes([taken], lease_ms=LEASE_MS)] == ["B"]
        # a live home is not taken, by claim or directly
        assert await store.claim_homes("C", lease_ms=LEASE_MS, limit=10, packages=None) == []
        with pytest.raises(StaleHomeError, match="homed by B"):
            await store.home_session("S1", "C", lease_ms=LEASE_MS)
        # a session never homed is its opener's for one lease (its row commits before the
        # opener homes it): not claimed meanwhile
        await session(store, "S2")
        assert await store.claim_homes("C", lease_ms=LEASE_MS, limit=10, packages=None) == []
        await expire()
        # then only sessions of the packages a daemon can run
        assert (
            await store.claim_homes(
                "C", lease_ms=SHORT_LEASE_MS, limit=10, packages=frozenset({"x"})
            )
            == []
        )
        (s2,) = await store.claim_homes(
            "C", lease_ms=SHORT_LEASE_MS, limit=10, packages=frozenset({"demo"})
        )
        assert s2.session_id == "S2"
        await store.release_home(s2)
        (again,) = await store.claim_homes("A", lease_ms=LEASE_MS, limit=10, packages=None)
        assert (again.session_id, again.token) == ("S2", s2.token + 1)


async def test_ledger_writes_are_fenced_by_the_home_and_heads_are_anchored(pg_dsn: str) -> None:
    """A daemon that lost a session's home can append nothing to its ledgers, not even with a
    turn claim it still holds; the heads follow every kept line."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        home_a = await store.home_session("S1", "A", lease_ms=SHORT_LEASE_MS)
        held = await store.start_attempt(await claimed(store, owner="A"), attempt(1))
        await store.anchor_ledger_lines("A", [line("S1/exec", 1), line("S1/evidence", 1)])
        await expire()
        (home_b,) = await store.claim_homes("B", lease_ms=LEASE_MS, limit=1, packages=None)
        with pytest.raises(StaleHomeError):
            await store.finish(
                held, TurnEnding(state=TurnState.SUCCEEDED), ledger_lines=[line("S1/exec", 2)]
            )
        with pytest.raises(StaleHomeError):
            await store.anchor_ledger_lines("A", [line("S1/exec", 2, salt="fork")])
        turn = await store.get_turn(held.turn_id)
        assert turn.state is TurnState.RUNNING  # nothing of the refused ending was written
        await store.anchor_ledger_lines("B", [line("S1/exec", 2), line("S1/exec", 3)])
        heads = {h.ledger_id: (h.seq, h.entry_hash) for h in await store.ledger_heads()}
        assert heads == {
            "S1/exec": (3, line("S1/exec", 3).entry_hash),
            "S1/evidence": (1, line("S1/evidence", 1).entry_hash),
        }
        # a line already kept may come again (idempotent); a different one is a fork
        await store.anchor_ledger_lines("B", [line("S1/exec", 3)])
        with pytest.raises(ValueError, match="different line at seq 3"):
            await store.anchor_ledger_lines("B", [line("S1/exec", 3, salt="fork")])
        assert home_a.token < home_b.token


async def test_heartbeats_list_the_daemons_with_their_leases(pg_dsn: str) -> None:
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        await store.home_session("S1", "A", lease_ms=LEASE_MS)
        await claimed(store, owner="A")
        await claimed(store, owner="A")
        await store.heartbeat("A", host="h1", pid=11, started_us=1, info={"ready": 2})
        await store.heartbeat("B", host="h2", pid=22, started_us=2, info={})
        await store.heartbeat("A", host="h1", pid=11, started_us=1, info={"ready": 3})
        found = {d.owner: d for d in await store.daemons()}
        assert set(found) == {"A", "B"}
        assert (found["A"].turns_held, found["A"].sessions_homed) == (2, 1)
        assert dict(found["A"].info) == {"ready": 3}
        assert found["A"].heartbeat_us >= found["B"].heartbeat_us - 1_000_000
        await store.forget_daemon("B")
        assert [d.owner for d in await store.daemons()] == ["A"]


async def test_a_resolution_asked_of_the_home_is_pending_until_carried_out(pg_dsn: str) -> None:
    """The resolution goes to the home with who asked (``decided_by``), which the home records
    in the turn's result when it carries it out."""
    by = {"action": "terminate", "uid": 1000, "pid": 7, "operator": "ann", "reason": "stuck"}
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        parked = await escalated(store)
        asked = await store.request_resolution(parked.turn_id, Resolution.TERMINATE, decided_by=by)
        assert asked.state is TurnState.ESCALATED
        ((pending, resolution, decided_by),) = await store.pending_resolutions(["S1"])
        assert (pending.turn_id, resolution) == (parked.turn_id, Resolution.TERMINATE)
        assert decided_by == by
        assert await store.pending_resolutions(["S2"]) == []
        done = await store.resolve_escalation(
            parked.turn_id,
            Resolution.TERMINATE,
            ledger_lines=[line("S1/exec", 1)],
            result={"decided_by": decided_by},
        )
        assert done.state is TurnState.TERMINATED
        assert done.result is not None
        assert done.result["decided_by"] == by
        assert await store.pending_resolutions(["S1"]) == []
        with pytest.raises(NotEscalatedError):
            await store.request_resolution(parked.turn_id, Resolution.CANCEL)


async def test_a_turn_nobody_holds_wakes_the_other_daemons(pg_dsn: str) -> None:
    """Accepting without a claim notifies; a listener wakes before its poll interval."""
    async with open_postgres_store(pg_dsn) as waker, open_postgres_store(pg_dsn) as sleeper:
        await session(waker)
        assert await sleeper.wait_for_work(0.05) is False
        woke: list[bool] = []

        async def wait() -> None:
            woke.append(await sleeper.wait_for_work(30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.1)
            await waker.accept(instruction())
        assert woke == [True]


async def test_a_hostile_row_is_an_integrity_error_naming_it(
    pg_dsn: str, pg_cluster: PgCluster
) -> None:
    """A row no hunter wrote (a state that does not exist, JSON that does not parse) raises
    `StoreIntegrityError` naming the table, the row and the field; other rows read on."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        bad = (await store.accept(instruction())).turn.turn_id
        good = (await store.accept(instruction())).turn.turn_id
        database = pg_dsn.partition("?")[0].rpartition("/")[2]
        pg_cluster.psql(
            f"UPDATE turns SET state = 'bogus' WHERE turn_id = {bad}", database=database
        )
        with pytest.raises(StoreIntegrityError, match=rf"turns\[{bad}\].*'bogus'"):
            await store.get_turn(bad)
        assert (await store.get_turn(good)).state is TurnState.ACCEPTED
        pg_cluster.psql(
            f"UPDATE turns SET state = 'accepted', spec = 'not json'::bytea WHERE turn_id = {bad}",
            database=database,
        )
        with pytest.raises(StoreIntegrityError, match=rf"turns\[{bad}\]"):
            await store.get_turn(bad)
