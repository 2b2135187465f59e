"""A session handed over to the daemon whose executors serve its waiting turns (issue 21), on
the private PostgreSQL cluster: the store's side of `supervisor.turns.handover.HandOver`."""

from __future__ import annotations

from supervisor.store.postgres import open_postgres_store
from tests.supervisor.store.conformance import (
    LEASE_MS,
    SHORT_LEASE_MS,
    claimed,
    expire,
    instruction,
    session,
)

READ = frozenset({"READ"})


async def test_a_handed_over_session_goes_to_a_daemon_serving_its_waiting_turns(
    pg_dsn: str,
) -> None:
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        home = await store.home_session("S1", "A", lease_ms=LEASE_MS)
        assert await store.session_homes() == {"S1": "A"}
        # a READ turn A parked (claimed at its accept), one accepted elsewhere (unclaimed), a
        # CLICK turn another daemon holds: A sees the two it may hand over, once per type
        held = await claimed(store, owner="A")
        await store.accept(instruction())
        await claimed(store, instruction(command="CLICK"), owner="B")
        assert await store.waiting_turns("A", ["S1"]) == [("S1", "READ")]
        await store.release(held)
        await store.release_home(home, reserve_ms=LEASE_MS)
        assert await store.session_homes(["S1"]) == {}
        # reserved: a daemon without READ does not take it, one with READ does
        assert await store.claim_homes("C", lease_ms=LEASE_MS, limit=5, packages=None) == []
        none = frozenset({"CLICK"})
        assert (
            await store.claim_homes("C", lease_ms=LEASE_MS, limit=5, packages=None, serves=none)
            == []
        )
        (taken,) = await store.claim_homes(
            "D", lease_ms=LEASE_MS, limit=5, packages=None, serves=READ
        )
        assert (taken.session_id, taken.owner) == ("S1", "D")
        assert await store.session_homes() == {"S1": "D"}


async def test_a_reservation_nobody_takes_runs_out(pg_dsn: str) -> None:
    """When no daemon serving the turns comes for the session within its reservation, any
    daemon takes it, so a session is never left without a home."""
    async with open_postgres_store(pg_dsn) as store:
        await session(store)
        home = await store.home_session("S1", "A", lease_ms=LEASE_MS)
        await store.accept(instruction())
        await store.release_home(home, reserve_ms=SHORT_LEASE_MS)
        await expire()
        (taken,) = await store.claim_homes("C", lease_ms=LEASE_MS, limit=5, packages=None)
        assert taken.owner == "C"
        # a plain release (a drain) reserves nothing: taken at once by anyone
        await store.release_home(taken)
        (again,) = await store.claim_homes("A", lease_ms=LEASE_MS, limit=5, packages=None)
        assert again.owner == "A"
