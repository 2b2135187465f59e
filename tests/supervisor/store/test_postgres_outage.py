"""The PostgreSQL engine across a server crash: writes wait and reconnect with backoff, nothing
acknowledged is lost, nothing is applied twice, and the statistics show the outage.

A private cluster of this test's own (the shared one serves the other tests) is stopped with
``pg_ctl -m immediate`` (every connection cut mid-transaction, as in a crash or a failover)
while writers commit, and started again.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from supervisor.store.postgres import open_postgres_store
from supervisor.store.protocol import NewSession
from tests.supervisor.store.conformance import instruction
from tests.supervisor.store.pg_cluster import (
    PgCluster,
    crash_and_restart,
)

pytestmark = pytest.mark.slow


async def test_writes_survive_a_server_crash(own_pg_cluster: PgCluster) -> None:
    dsn = own_pg_cluster.dsn()
    acknowledged: list[tuple[str, int]] = []
    async with open_postgres_store(dsn) as store:
        for n in range(4):
            await store.open_session(NewSession(session_id=f"S{n}", package_id="demo"))

        async def writer(n: int) -> None:
            for i in range(60):
                accepted = await store.accept(instruction(f"S{n}", key=f"k{i}"))
                acknowledged.append((f"S{n}", accepted.turn.turn_id))
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(writer, n)
            await anyio.sleep(0.3)
            await anyio.to_thread.run_sync(lambda: crash_and_restart(own_pg_cluster, down_s=1.0))
        stats = store.statistics()
        assert stats.outages >= 1
        assert stats.available
        assert "Error" in stats.last_error or "connection" in stats.last_error.lower()
        # every acknowledged turn is there once; nothing else was accepted
        page = await store.list_turns(limit=10_000)
        stored = [(t.session_id, t.turn_id) for t in page.turns]
        assert sorted(stored) == sorted(acknowledged)
        assert len(acknowledged) == 240
        numbers = {(t.session_id, t.turn_number) for t in page.turns}
        assert len(numbers) == 240  # no turn number taken twice
        for n in range(4):
            session = await store.get_session(f"S{n}")
            assert session.turns == 60
