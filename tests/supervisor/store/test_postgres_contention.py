"""Several daemons' stores on one PostgreSQL under contention (the private cluster): renewals
on a connection of their own, lock and idle timeouts below the lease, one lock order (no
deadlock), idempotency-key races, and a paused daemon's homes all taken over.

What each test stands for (`supervisor.store.postgres.connections`, `batches`, `operations`):

* renewals of turn claims and session homes, and the heartbeat, happen while the committer's
  batch is blocked by another connection's row lock;
* a transaction left idle (a daemon paused inside it) is cut by the server after
  ``idle_in_transaction_session_timeout`` (half a lease), after which one ``claim_homes`` takes
  every lapsed home, not the one the locks left; a lock timeout runs the batch again;
* keyed accepts, claims, renewals, home claims and anchors from three stores at once leave no
  "deadlock detected" in the server's log;
* the same (session, key) accepted by two stores at once answers one turn on both, in batches
  of one op and of many, and no turn number is skipped;
* a read cancelled while its statement ran leaves its connection usable (it used to answer
  "cannot use Connection.transaction() in a manually started transaction" from then on).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import anyio
import asyncpg
import pytest

from sandbox.policy.lifecycle import TurnState
from supervisor.errors import StaleClaimError
from supervisor.store.fleet import SessionHome, StaleHomeError
from supervisor.store.postgres import PostgresTurnStore, open_postgres_store
from supervisor.store.postgres.connections import Timeouts
from supervisor.store.protocol import Claim, NewSession, PendingWrite, TurnEnding
from tests.supervisor.store.conformance import (
    SHORT_LEASE_MS,
    attempt,
    expire,
    instruction,
    line,
    session,
)
from tests.supervisor.store.pg_cluster import PgCluster


async def _lock_rows(
    conn: asyncpg.Connection, sessions: Sequence[str], turns: Sequence[int] = ()
) -> None:
    """Open a transaction on *conn* holding these rows (as another daemon's batch would)."""
    await conn.execute("BEGIN")
    await conn.fetch(
        "SELECT session_id FROM sessions WHERE session_id = ANY($1::text[])"
        " ORDER BY session_id FOR NO KEY UPDATE",
        list(sessions),
    )
    await conn.fetch(
        "SELECT turn_id FROM turns WHERE turn_id = ANY($1::bigint[]) ORDER BY turn_id"
        " FOR NO KEY UPDATE",
        list(turns),
    )


async def _waiting(conn: asyncpg.Connection, count: int) -> None:
    """Until *count* sessions of *conn*'s database wait for a lock (the test's ordering, not
    a sleep that a loaded machine may outlast)."""
    with anyio.fail_after(10):
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if waiting >= count:
                return
            await anyio.sleep(0.01)


def _done_flag(pending: PendingWrite[object]) -> Callable[[], bool]:
    done: list[bool] = []
    pending.when_done(lambda: done.append(True))
    return lambda: bool(done)


def test_the_timeouts_follow_the_lease() -> None:
    two_s = Timeouts.for_lease(2_000)
    assert (two_s.lock_ms, two_s.idle_ms, two_s.statement_ms) == (500, 1_000, 2_000)
    assert (two_s.renew_lock_ms, two_s.renew_statement_ms) == (500, 500)
    writer = two_s.settings("writer")
    assert writer["lock_timeout"] == "500"
    assert writer["idle_in_transaction_session_timeout"] == "1000"
    assert writer["statement_timeout"] == "2000"
    assert two_s.settings("reader")["statement_timeout"] == "0"  # a read locks no row
    assert two_s.settings("renewal")["statement_timeout"] == "500"
    # the floors: a tiny lease does not make every wait an error
    tiny = Timeouts.for_lease(1)
    assert (tiny.lock_ms, tiny.idle_ms, tiny.statement_ms) == (50, 100, 1_000)
    with pytest.raises(ValueError, match="positive"):
        Timeouts.for_lease(0)


async def test_every_connection_runs_with_the_timeouts(pg_dsn: str) -> None:
    shown = (
        "SELECT current_setting('lock_timeout'),"
        " current_setting('idle_in_transaction_session_timeout'),"
        " current_setting('statement_timeout')"
    )

    async def show(conn: asyncpg.Connection) -> tuple[str, ...]:
        row = await conn.fetchrow(shown)
        assert row is not None
        return tuple(str(v) for v in row.values())

    async with open_postgres_store(pg_dsn, lease_ms=4_000) as store:
        assert await store._write(show) == ("1s", "2s", "4s")
        assert await store._read(show) == ("1s", "2s", "0")
        assert await store._renew(show) == ("1s", "2s", "1s")


async def test_without_a_lease_the_timeouts_follow_the_renewals(pg_dsn: str) -> None:
    """A store not told its lease runs with a 30 s lease's timeouts until the daemon renews:
    then every connection takes those of the lease it renews with (a test's lease of a few
    milliseconds teaches nothing); a store told its lease keeps it."""

    async def lock_timeout(conn: asyncpg.Connection) -> str:
        return str(await conn.fetchval("SELECT current_setting('lock_timeout')"))

    async with (
        open_postgres_store(pg_dsn) as store,
        open_postgres_store(pg_dsn, lease_ms=4_000) as told,
    ):
        await session(store)
        assert store.timeouts == Timeouts.for_lease(30_000)
        home = await store.home_session("S1", "A", lease_ms=SHORT_LEASE_MS)
        await store.renew_homes([home], lease_ms=SHORT_LEASE_MS)
        assert store.timeouts == Timeouts.for_lease(30_000)
        await store.renew_homes([home], lease_ms=2_000)
        assert store.timeouts == Timeouts.for_lease(2_000)
        assert await store._write(lock_timeout) == "500ms"
        assert await store._read(lock_timeout) == "500ms"
        assert await store._read(lock_timeout) == "500ms"  # the other reader too
        assert await store._renew(lock_timeout) == "500ms"
        await told.renew_homes([home], lease_ms=2_000)
        assert told.timeouts == Timeouts.for_lease(4_000)


async def test_renewals_do_not_wait_behind_a_blocked_batch(pg_dsn: str) -> None:
    """Another connection holds a session's and a turn's rows; the committer's batch that
    needs the session waits. Meanwhile the claims and homes on free rows are renewed at once
    and the heartbeat written; those on the held rows are waited for a quarter lease at most,
    then kept (not lost), and renewed by the next round once the rows are free."""
    lease_ms = 4_000
    async with open_postgres_store(pg_dsn, lease_ms=lease_ms) as store:
        await session(store)
        await session(store, "S2")
        homes = [await store.home_session(s, "A", lease_ms=lease_ms) for s in ("S1", "S2")]
        claims: list[Claim] = []
        for sid in ("S1", "S2"):
            got = await store.accept(instruction(sid), claim_for="A", lease_ms=lease_ms)
            assert got.claim is not None
            claims.append(got.claim)
        other = await asyncpg.connect(pg_dsn)
        try:
            await _lock_rows(other, ["S2"], [claims[1].turn_id])
            blocked = store.accept_soon(instruction("S2"), claim_for="A", lease_ms=lease_ms)
            blocked_done = _done_flag(blocked)
            await _waiting(other, 1)  # the batch is waiting for S2 now
            renewed: list[Claim] = []
            renewed_homes: list[SessionHome] = []

            async def renewal_round() -> None:
                renewed.extend(await store.renew(claims, lease_ms=lease_ms))
                renewed_homes.extend(await store.renew_homes(homes, lease_ms=lease_ms))
                await store.heartbeat("A", host="h1", pid=1, started_us=1, info={})

            began = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(renewal_round)
                await _waiting(other, 2)  # the renewal waits for the held turn
                # the free claim is renewed already, while the round waits for the held one
                until = await other.fetchval(
                    "SELECT lease_until_us FROM turns WHERE turn_id = $1", claims[0].turn_id
                )
                assert until > claims[0].lease_until_us
            took = time.monotonic() - began
            # two waits of a quarter lease at most (the held claim, the held home)
            assert took < 2 * store.timeouts.renew_lock_ms / 1000 + 1.0, took
            assert not blocked_done()  # the batch is still blocked
            # free rows renewed; held rows still held (the next round renews them)
            assert [c.turn_id for c in renewed] == [c.turn_id for c in claims]
            assert renewed[0].lease_until_us > claims[0].lease_until_us
            assert renewed[1].lease_until_us == claims[1].lease_until_us
            assert [h.session_id for h in renewed_homes] == ["S1", "S2"]
            assert renewed_homes[0].lease_until_us > homes[0].lease_until_us
            assert renewed_homes[1].lease_until_us == homes[1].lease_until_us
            assert [d.owner for d in await store.daemons()] == ["A"]
        finally:
            await other.close()  # its transaction ends: the batch goes on
        assert (await blocked.result()).created
        again = await store.renew(renewed, lease_ms=lease_ms)
        assert again[1].lease_until_us > claims[1].lease_until_us
        homes_again = await store.renew_homes(renewed_homes, lease_ms=lease_ms)
        assert homes_again[1].lease_until_us > homes[1].lease_until_us


async def test_a_renewal_waits_for_a_row_a_batch_holds_briefly(pg_dsn: str) -> None:
    """A row held for less than the renewal's lock timeout (the daemon's own batch writing
    it, say) is waited for and renewed in the same call."""
    lease_ms = 8_000  # a 2 s lock timeout: the 0.3 s hold ends well before it
    async with open_postgres_store(pg_dsn, lease_ms=lease_ms) as store:
        await session(store)
        home = await store.home_session("S1", "A", lease_ms=lease_ms)
        other = await asyncpg.connect(pg_dsn)
        try:
            await _lock_rows(other, ["S1"])

            async def release_soon() -> None:
                await anyio.sleep(0.3)
                await other.execute("COMMIT")

            async with anyio.create_task_group() as tg:
                tg.start_soon(release_soon)
                (renewed,) = await store.renew_homes([home], lease_ms=lease_ms)
            assert renewed.lease_until_us > home.lease_until_us
        finally:
            await other.close()


async def test_a_claim_ended_by_a_write_in_flight_is_not_reported_lost(pg_dsn: str) -> None:
    """The renewal runs beside the committer: an ending of this store that commits while a
    renewal waits for the turn's row leaves the claim in that renewal's answer (not renewed),
    so the daemon does not take its own ending for another daemon's takeover; the next
    renewal leaves it out."""
    lease_ms = 4_000
    async with open_postgres_store(pg_dsn, lease_ms=lease_ms) as store:
        await session(store)
        got = await store.accept(instruction(), claim_for="A", lease_ms=lease_ms)
        assert got.claim is not None
        claim = got.claim
        other = await asyncpg.connect(pg_dsn)
        try:
            await _lock_rows(other, [], [claim.turn_id])
            ending = store.finish_soon(claim, TurnEnding(state=TurnState.TERMINATED))
            await _waiting(other, 1)  # the ending waits for the row
            answers: list[list[Claim]] = []

            async def renewal() -> None:
                answers.append(await store.renew([claim], lease_ms=lease_ms))

            async with anyio.create_task_group() as tg:
                tg.start_soon(renewal)
                await _waiting(other, 2)  # and the renewal behind it
                await other.execute("COMMIT")  # the ending commits first, then the renewal
            assert (await ending.result()).state is TurnState.TERMINATED
        finally:
            await other.close()
        assert [c.lease_until_us for c in answers[0]] == [claim.lease_until_us]
        assert await store.renew([claim], lease_ms=lease_ms) == []


async def test_a_lost_claim_is_left_out_of_a_renewal(pg_dsn: str) -> None:
    """Skipping locked rows does not keep a claim or a home another daemon took meanwhile."""
    async with open_postgres_store(pg_dsn, lease_ms=2_000) as store:
        await session(store)
        home = await store.home_session("S1", "A", lease_ms=SHORT_LEASE_MS)
        got = await store.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
        assert got.claim is not None
        await expire()
        (taken,) = await store.claim("B", limit=1, lease_ms=2_000)  # the lapsed claim
        assert taken.turn_id == got.claim.turn_id
        assert await store.claim_homes("B", lease_ms=2_000, limit=5, packages=None)
        assert await store.renew([got.claim], lease_ms=2_000) == []
        assert await store.renew_homes([home], lease_ms=2_000) == []


async def test_a_paused_transaction_is_cut_and_every_lapsed_home_taken(pg_dsn: str) -> None:
    """A connection with the store's settings opens a transaction, locks the rows of the four
    sessions its daemon homes, and goes quiet (a daemon SIGSTOPped inside its batch). The
    server ends it after half a lease; once the homes lapse, one claim_homes of another
    daemon takes all four, within the lease and a little."""
    lease_ms = 2_000
    sessions = ["S1", "S2", "S3", "S4"]
    async with (
        open_postgres_store(pg_dsn, lease_ms=lease_ms) as a,
        open_postgres_store(pg_dsn, lease_ms=lease_ms) as b,
    ):
        for sid in sessions:
            await session(a, sid)
            await a.home_session(sid, "A", lease_ms=lease_ms)
        began = time.monotonic()
        paused = await asyncpg.connect(pg_dsn, server_settings=a.timeouts.settings("writer"))
        try:
            await _lock_rows(paused, sessions)
            await anyio.sleep(a.timeouts.idle_ms / 1000 + 0.3)  # idle in its transaction
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
                await paused.fetchval("SELECT 1")  # the server ended it
            assert paused.is_closed()
        finally:
            paused.terminate()
        taken: list[SessionHome] = []
        deadline = began + lease_ms / 1000 + 3
        while len(taken) < len(sessions) and time.monotonic() < deadline:
            taken += await b.claim_homes("B", lease_ms=lease_ms, limit=16, packages=None)
            await anyio.sleep(0.05)
        assert sorted(h.session_id for h in taken) == sessions
        assert {h.owner for h in taken} == {"B"}
        rounds_after_lapse = time.monotonic() - began - lease_ms / 1000
        assert rounds_after_lapse < 2.0  # the lease and a claim round or two


async def test_a_paused_writer_loses_its_locks_and_its_batch_runs_again(pg_dsn: str) -> None:
    """The store's own writer stalls inside a batch holding its sessions' rows (its event loop
    starved past half a lease): the server cuts the connection, another daemon takes the
    homes once they lapse, and the stalled batch, when it wakes, runs again on a new
    connection (its transaction never committed)."""
    lease_ms = 2_000
    sessions = ["S1", "S2", "S3"]
    async with (
        open_postgres_store(pg_dsn, lease_ms=lease_ms) as a,
        open_postgres_store(pg_dsn, lease_ms=lease_ms) as b,
    ):
        for sid in sessions:
            await session(a, sid)
            await a.home_session(sid, "A", lease_ms=lease_ms)
        runs: list[int] = []

        async def stall_once(conn: asyncpg.Connection) -> int:
            await conn.fetch(
                "SELECT 1 FROM sessions WHERE session_id = ANY($1::text[])"
                " ORDER BY session_id FOR SHARE",
                sessions,
            )
            runs.append(1)
            if len(runs) == 1:
                time.sleep(a.timeouts.idle_ms / 1000 + 0.3)  # noqa: ASYNC251 (a starved loop)
            return len(runs)

        began = time.monotonic()
        assert await a._write(stall_once) == 2  # ran again after its connection was cut
        taken: list[SessionHome] = []
        while len(taken) < len(sessions) and time.monotonic() < began + lease_ms / 1000 + 3:
            taken += await b.claim_homes("B", lease_ms=lease_ms, limit=16, packages=None)
            await anyio.sleep(0.05)
        assert sorted(h.session_id for h in taken) == sessions
        assert a.statistics().outages == 1


async def test_a_lock_timeout_runs_the_batch_again(pg_dsn: str) -> None:
    """A row held past the writer's lock timeout (a quarter lease) makes the batch run again,
    not fail: the accept waiting for it, and the one queued with it, both commit once the row
    is free."""
    lease_ms = 1_000
    async with open_postgres_store(pg_dsn, lease_ms=lease_ms) as store:
        await session(store)
        await session(store, "S2")
        other = await asyncpg.connect(pg_dsn)
        try:
            await _lock_rows(other, ["S1"])
            first = store.accept_soon(instruction("S1"))
            second = store.accept_soon(instruction("S2"))
            await anyio.sleep(3 * store.timeouts.lock_ms / 1000)  # a few lock timeouts
        finally:
            await other.close()
        assert (await first.result()).created
        assert (await second.result()).created


async def test_claim_homes_takes_every_lapsed_home_it_can_lock(pg_dsn: str) -> None:
    """Rows another transaction holds are skipped, and LIMIT counts the homes taken: the free
    ones are all taken in one call, the held ones by the next once they are free."""
    sessions = [f"S{i}" for i in range(1, 7)]
    async with open_postgres_store(pg_dsn) as store:
        for sid in sessions:
            await session(store, sid)
            await store.home_session(sid, "A", lease_ms=SHORT_LEASE_MS)
        await expire()
        other = await asyncpg.connect(pg_dsn)
        try:
            await _lock_rows(other, ["S2", "S5"])
            first = await store.claim_homes("B", lease_ms=60_000, limit=16, packages=None)
            assert sorted(h.session_id for h in first) == ["S1", "S3", "S4", "S6"]
        finally:
            await other.close()
        rest = await store.claim_homes("B", lease_ms=60_000, limit=16, packages=None)
        assert sorted(h.session_id for h in rest) == ["S2", "S5"]
        # and a limit smaller than what lapsed takes that many, the oldest first
        for home in first + rest:
            await store.release_home(home)
        some = await store.claim_homes("C", lease_ms=60_000, limit=4, packages=None)
        assert [h.session_id for h in some] == sessions[:4]


async def test_a_key_raced_by_two_daemons_answers_one_turn(pg_dsn: str) -> None:
    """Two stores accept the same (session, key) at once, alone in their batches and among
    many: every call answers the same turn, one of them creates it, nothing raises, and the
    session's turn numbers have no gap."""
    async with (
        open_postgres_store(pg_dsn) as a,
        open_postgres_store(pg_dsn) as b,
        open_postgres_store(pg_dsn) as c,
    ):
        await session(a)
        stores = (a, b, c)
        keys = 0

        async def race(key: str) -> None:
            answers = []

            async def one(store: PostgresTurnStore, owner: str) -> None:
                answers.append(
                    await store.accept(instruction(key=key), claim_for=owner, lease_ms=60_000)
                )

            async with anyio.create_task_group() as tg:
                for n, store in enumerate(stores):
                    tg.start_soon(one, store, f"D{n}")
            assert len({x.turn.turn_id for x in answers}) == 1, answers
            assert sum(x.created for x in answers) == 1

        for n in range(25):  # each accept alone in its store's batch
            await race(f"alone-{n}")
            keys += 1
        async with anyio.create_task_group() as tg:  # many keys at once: batches of many
            for n in range(40):
                tg.start_soon(race, f"many-{n}")
                keys += 1
        page = await a.list_turns(session_id="S1", limit=1_000)
        assert sorted(t.turn_number for t in page.turns) == list(range(1, keys + 1))
        assert (await a.get_session("S1")).turns == keys


async def test_a_batch_locks_the_rows_of_any_session_id(pg_dsn: str) -> None:
    """The batch's row locks go with its BEGIN as literals: ids with quotes, backslashes and
    other characters lock their rows like any other; one that cannot name a row (a NUL) is
    left to its op, which fails alone."""
    odd = ["it's", "back\\slash", 'quo"te', "ünïcødé", "a'; DROP TABLE turns; --"]
    async with open_postgres_store(pg_dsn) as store:
        for sid in odd:
            await session(store, sid)
        queued = [store.accept_soon(instruction(sid)) for sid in odd]
        keyed = [store.accept_soon(instruction(sid, key="k")) for sid in odd]
        bad = store.accept_soon(instruction("nul\x00"))
        for pending in queued + keyed:
            assert (await pending.result()).created
        with pytest.raises(asyncpg.PostgresError, match="0x00"):
            await bad.result()
        for sid in odd:
            assert (await store.get_session(sid)).turns == 2


async def test_a_cancelled_read_leaves_its_connection_usable(pg_dsn: str) -> None:
    """Reads cancelled while their statement runs (a caller's timeout) do not leave their
    connections inside a transaction: every later read, a keyed submit's look-up among them,
    works."""
    async with open_postgres_store(pg_dsn, read_connections=2) as store:
        await session(store)
        await store.accept(instruction(key="k"))

        async def slow(conn: asyncpg.Connection) -> object:
            return await conn.fetchval("SELECT pg_sleep(5)")

        for _ in range(4):
            with anyio.move_on_after(0.1):
                await store._read(slow)
        for _ in range(6):
            found = await store.find_turn("S1", "k")
            assert found is not None
            assert (await store.accept(instruction(key="k"))).turn.turn_id == found.turn_id


# -- no deadlock under a mixed load from three daemons ---------------------------------------

_SESSIONS = [f"S{i:02d}" for i in range(8)]
_EXPECTED = (StaleHomeError, StaleClaimError)


async def _daemon_load(
    store: PostgresTurnStore, owner: str, until: float, seed: int, failures: Counter[str]
) -> None:
    """One daemon's writes, many at once: keyed accepts racing the others' on shared keys,
    plain accepts, anchors across sessions (their rows ``FOR SHARE``), claims with starts and
    endings, claim renewals, home claims, renewals and releases."""
    rng = random.Random(seed)
    held: list[Claim] = []
    homes: list[SessionHome] = []

    async def guarded(step: Callable[[], Awaitable[object]]) -> None:
        try:
            await step()
        except _EXPECTED:
            pass
        except Exception as exc:
            failures[f"{type(exc).__name__}: {exc}"] += 1

    async def keyed() -> None:
        sid = rng.choice(_SESSIONS)
        await store.accept(instruction(sid, key=f"k{rng.randrange(30)}"))

    async def plain() -> None:
        await store.accept(instruction(rng.choice(_SESSIONS)), claim_for=owner, lease_ms=5_000)

    async def anchor() -> None:
        chosen = rng.sample(_SESSIONS, 4)
        await store.anchor_ledger_lines(owner, [line(f"{s}/exec", 1) for s in chosen])

    async def claims() -> None:
        held.extend(await store.claim(owner, limit=3, lease_ms=5_000))
        held[:] = await store.renew(held, lease_ms=5_000)
        for claim in held[:2]:
            held.remove(claim)
            started = await store.start_attempt(claim, attempt(1))
            await store.finish(
                started, TurnEnding(state=TurnState.SUCCEEDED), [attempt(1, decision="SUCCEED")]
            )

    async def home_round() -> None:
        homes.extend(await store.claim_homes(owner, lease_ms=400, limit=16, packages=None))
        homes[:] = await store.renew_homes(homes, lease_ms=400)
        await store.heartbeat(owner, host="h", pid=seed, started_us=1, info={})
        for home in homes[:2]:
            homes.remove(home)
            await store.release_home(home)

    while time.monotonic() < until:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(guarded, keyed)
            tg.start_soon(guarded, plain)
            tg.start_soon(guarded, anchor)
            tg.start_soon(guarded, claims)
            tg.start_soon(guarded, home_round)


async def test_a_mixed_load_of_three_daemons_never_deadlocks(own_pg_cluster: PgCluster) -> None:
    """Keyed accepts, claims, renewals, home claims and anchors from three stores on one
    database for a few seconds: the server's log has no "deadlock detected", and every write
    either committed or was refused by its fence (no lock timeout outlasted the reruns)."""
    dsn = own_pg_cluster.dsn()
    log = own_pg_cluster.root / "server.log"
    async with open_postgres_store(dsn) as setup:
        for sid in _SESSIONS:
            await setup.open_session(NewSession(session_id=sid, package_id="demo"))
    failures: Counter[str] = Counter()
    until = time.monotonic() + 5
    async with (
        open_postgres_store(dsn, lease_ms=3_000) as a,
        open_postgres_store(dsn, lease_ms=3_000) as b,
        open_postgres_store(dsn, lease_ms=3_000) as c,
        anyio.create_task_group() as tg,
    ):
        for n, store in enumerate((a, b, c)):
            tg.start_soon(_daemon_load, store, f"D{n}", until, n, failures)
    assert not failures, failures
    assert min(s.statistics().commits for s in (a, b, c)) > 20
    text = log.read_text(errors="replace")
    assert "deadlock detected" not in text, [x for x in text.splitlines() if "ERROR" in x][:10]
