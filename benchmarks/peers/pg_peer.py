"""The multi-host engine (the daemon on PostgreSQL) beside pgqueuer, on one private cluster.

Both sides use the same cluster (``tests/supervisor/store/pg_cluster.py``: Unix socket only,
``fsync`` and ``synchronous_commit`` on), a database each, the same number of worker processes
and the closed-loop client of ``dispatch.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import asyncpg
import psutil
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries
from pgqueuer.core.completion import CompletionWatcher

from benchmarks import bench_fleet
from benchmarks.peers.dispatch import REPO, LevelResult, Window, cpu_seconds, daemon_level
from benchmarks.peers.pgq_worker import ENTRYPOINT
from supervisor.store.postgres import migrate_database
from tests.supervisor.store.pg_cluster import PgCluster, start_cluster, stop_cluster


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[PgCluster]:
    """A private cluster, stopped and removed afterwards."""
    started = await anyio.to_thread.run_sync(start_cluster)
    try:
        yield started
    finally:
        await anyio.to_thread.run_sync(stop_cluster, started)


async def _create_database(pg: PgCluster, name: str) -> str:
    conn = await asyncpg.connect(pg.dsn())
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return pg.dsn(name)


def server_version(pg: PgCluster) -> str:
    """``PostgreSQL 15.x`` of the cluster."""
    return " ".join(pg.psql("SHOW server_version").split()[:1]).join(["PostgreSQL ", ""])


def server_pids(pg: PgCluster) -> list[int]:
    """The postmaster (its backends are its children)."""
    return [int((pg.data / "postmaster.pid").read_text().split()[0])]


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


async def daemon_round(
    pg: PgCluster, round_no: int, *, levels: Sequence[int], warm_s: float, seconds: float
) -> list[LevelResult]:
    """bench_fleet's daemon (``[store] engine = "postgres"``, 4 no-op executor processes x 8
    slots) on a fresh database; every level measured like the SQLite dispatch rows."""
    dsn = await _create_database(pg, f"hunter{round_no}")
    await migrate_database(dsn)
    bench = bench_fleet._executor_bench()
    base = Path(tempfile.mkdtemp(prefix="hh-compare-pg-"))
    os.chmod(base, 0o711)
    try:
        daemon = await bench_fleet._start(base, f"r{round_no}", bench, dsn)
        try:
            assert daemon.stack.daemon is not None
            pids = [daemon.stack.daemon.pid, *(e.pid for e in daemon.executors), *server_pids(pg)]
            return [
                await daemon_level(
                    daemon.stack, daemon.sid, pids, in_flight=n, warm_s=warm_s, seconds=seconds
                )
                for n in levels
            ]
        finally:
            await bench_fleet._stop(daemon)
    finally:
        shutil.rmtree(base, ignore_errors=True)


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
    dsn = await _create_database(pg, f"pgq{round_no}")
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
        pids = [*(p.pid for p in processes), *server_pids(pg)]
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

                server0, client0 = cpu_seconds(pids), _own_cpu()
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(lane)
                server1, client1 = cpu_seconds(pids), _own_cpu()
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
