"""The multi-host engine (the daemon on PostgreSQL) beside pgqueuer, on one private cluster.

Both sides use the same cluster (``tests/supervisor/store/pg_cluster.py``: Unix socket only,
``fsync`` and ``synchronous_commit`` on), a database each, the same number of worker processes
and the closed-loop client of ``dispatch.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import anyio
import anyio.abc
import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries
from pgqueuer.core.completion import CompletionWatcher

from benchmarks import bench_fleet
from benchmarks.harness import REPO, cpu_seconds, fresh_database, own_cpu, pg_server_pids
from benchmarks.peers.dispatch import LevelResult, Window, daemon_level
from benchmarks.peers.pgq_worker import ENTRYPOINT
from tests.supervisor.store.pg_cluster import PgCluster


def server_version(pg: PgCluster) -> str:
    """``PostgreSQL 15.x`` of the cluster."""
    return " ".join(pg.psql("SHOW server_version").split()[:1]).join(["PostgreSQL ", ""])


async def daemon_round(
    pg: PgCluster, round_no: int, *, levels: Sequence[int], warm_s: float, seconds: float
) -> list[LevelResult]:
    """bench_fleet's daemon (``[store] engine = "postgres"``, 4 no-op executor processes x 8
    slots) on a fresh database; every level measured like the SQLite dispatch rows."""
    dsn = await fresh_database(pg, f"hunter{round_no}")
    async with bench_fleet.fleet_daemon(f"r{round_no}", dsn, prefix="hh-compare-pg-") as daemon:
        pids = [*daemon.pids, *pg_server_pids(pg)]
        return [
            await daemon_level(daemon, pids, in_flight=n, warm_s=warm_s, seconds=seconds)
            for n in levels
        ]


async def pgqueuer_round(
    pg: PgCluster,
    round_no: int,
    *,
    workers: int,
    levels: Sequence[int],
    warm_s: float,
    seconds: float,
) -> list[LevelResult]:
    """pgqueuer's schema on a fresh database, *workers* worker processes, and per level a client
    that enqueues a job and waits for its terminal state (``CompletionWatcher``, LISTEN/NOTIFY,
    debounce 1 ms instead of its default 50 ms, which would dominate the latency)."""
    dsn = await fresh_database(pg, f"pgq{round_no}", migrate=False)
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    processes: list[anyio.abc.Process] = []
    pool: asyncpg.Pool | None = None
    listen: asyncpg.Connection | None = None
    try:
        for _ in range(workers):
            processes.append(
                await anyio.open_process(
                    [sys.executable, "-m", "benchmarks.peers.pgq_worker", dsn],
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=None,
                    start_new_session=True,
                )
            )
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        listen = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgPoolDriver(pool))
        watcher_driver = AsyncpgDriver(listen)
        pids = [*(p.pid for p in processes), *pg_server_pids(pg)]
        results: list[LevelResult] = []
        async with CompletionWatcher(
            watcher_driver, queries=Queries(watcher_driver), debounce=timedelta(milliseconds=1)
        ) as watcher:

            async def one() -> None:
                (job_id,) = await queries.enqueue(ENTRYPOINT, None)
                status = await watcher.wait_for(job_id)
                if status != "successful":
                    raise RuntimeError(f"pgqueuer job {job_id} ended {status}")

            with anyio.fail_after(60):
                for _ in range(2 * workers):  # the workers are up and warm
                    await one()
            for n in levels:
                window = Window(warm_s=warm_s, seconds=seconds)

                async def lane(window: Window = window) -> None:
                    while (started := time.perf_counter()) < window.end:
                        await one()
                        window.record(started, time.perf_counter())

                server0, client0 = cpu_seconds(pids), own_cpu()
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(lane)
                server1, client1 = cpu_seconds(pids), own_cpu()
                results.append(window.result(n, server1 - server0, client1 - client0))
        return results
    finally:
        if listen is not None:
            await listen.close()
        if pool is not None:
            await pool.close()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            with anyio.move_on_after(10):
                await process.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            await process.aclose()
