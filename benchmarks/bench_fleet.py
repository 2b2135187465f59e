"""Benchmark of several daemons on one PostgreSQL against one daemon on SQLite (same run).

Run: ``.venv/bin/python benchmarks/bench_fleet.py`` (about two minutes on 2 cores; it starts a
private PostgreSQL cluster as ``tests/supervisor/store/pg_cluster.py`` does).

Rows, each with real ``hunter serve`` processes, no-op SDK executors (4 processes x 8 slots per
daemon), instruction turns submitted over ``control.sock`` with ``turn.submit`` + ``wait_s``:

* baseline: one daemon on the embedded SQLite store;
* 1, 2 and 3 daemons on one PostgreSQL database (three roots standing for three hosts), each
  daemon the home of its own session, clients spread over the daemons.

For each: throughput with 64 turns in flight in total (split over the daemons), p50 of one turn
at a time on the first daemon, the daemons' store commits and writes per turn, PostgreSQL's
transactions per turn (``pg_stat_database``), and CPU per turn. Every daemon, every executor and
the server share the same 2 cores here, so more daemons cannot add throughput on this machine:
the figures say what one turn costs on each engine, from which `docs/multi-host.md` derives the
scaling model.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks.harness import (  # noqa: E402
    BenchDaemon,
    cpu_seconds,
    fresh_database,
    noop,
    pg_cluster,
    pg_server_pids,
    pipelined,
    running_daemon,
)
from supervisor.control.client import ControlClient  # noqa: E402
from tests.supervisor.store.pg_cluster import PgCluster  # noqa: E402

SECONDS = 5.0
IN_FLIGHT = 64
LATENCY_TURNS = 200
EXECUTOR_PROCS = 4
SLOTS = 8

TURN: dict[str, Any] = {
    "kind": "instruction",
    "command_type": "READ",
    "target_selector": "#main",
    "timeout_ms": 5000,
    "declared_outputs": [],
}


def fleet_daemon(
    name: str, dsn: str | None, *, base: Path | None = None, prefix: str = "hh-bench-fleet-"
) -> contextlib.AbstractAsyncContextManager[BenchDaemon]:
    """One daemon of a row: root *name* (under *base*), the PostgreSQL store at *dsn* or the
    embedded SQLite one, EXECUTOR_PROCS no-op executor processes of SLOTS slots, a session."""
    return running_daemon(
        dsn=dsn,
        base=base,
        name=name,
        prefix=prefix,
        executors=[[f"{name}-noop-{p}-0"] for p in range(EXECUTOR_PROCS)],
        spawn=noop(SLOTS),
    )


async def _latency(daemon: BenchDaemon) -> float:
    samples = []
    async with ControlClient(daemon.control_socket) as client:
        for i in range(30 + LATENCY_TURNS):
            start = time.perf_counter()
            result = await client.call("turn.submit", session_id=daemon.sid, wait_s=30, **TURN)
            assert result["turn"]["state"] == "succeeded", result["turn"]
            if i >= 30:
                samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


async def _throughput(daemons: list[BenchDaemon]) -> tuple[int, float]:
    done = 0
    deadline = time.perf_counter() + SECONDS
    lanes = IN_FLIGHT // (2 * len(daemons))

    async def connections(daemon: BenchDaemon) -> None:
        async def lane(conn: ControlClient) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                r = await conn.call("turn.submit", session_id=daemon.sid, wait_s=30, **TURN)
                assert r["turn"]["state"] == "succeeded", r["turn"]
                done += 1

        await pipelined(daemon.control_socket, 2, lanes, lane)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for daemon in daemons:
            tg.start_soon(connections, daemon)
    return done, time.perf_counter() - start


async def _pg_xacts(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await conn.close()


def _server_cpu(cluster: PgCluster | None) -> float:
    """CPU seconds of the PostgreSQL server so far (the postmaster and every backend)."""
    if cluster is None:
        return 0.0
    return cpu_seconds(pg_server_pids(cluster))


async def _row(
    base: Path, count: int, dsn: str | None, cluster: PgCluster | None
) -> dict[str, float]:
    async with contextlib.AsyncExitStack() as running:
        daemons = [
            await running.enter_async_context(fleet_daemon(f"d{count}-{n}", dsn, base=base))
            for n in range(count)
        ]
        p50 = await _latency(daemons[0])
        before = [await d.call("status") for d in daemons]
        cpu0 = sum(d.cpu_s() for d in daemons)
        x0 = await _pg_xacts(dsn) if dsn else 0
        s0 = _server_cpu(cluster)
        done, elapsed = await _throughput(daemons)
        s1 = _server_cpu(cluster)
        x1 = await _pg_xacts(dsn) if dsn else 0
        cpu1 = sum(d.cpu_s() for d in daemons)
        after = [await d.call("status") for d in daemons]
    commits = sum(
        a["store"]["commits"] - b["store"]["commits"] for a, b in zip(after, before, strict=True)
    )
    trips = sum(
        a["store"].get("round_trips", 0) - b["store"].get("round_trips", 0)
        for a, b in zip(after, before, strict=True)
    )
    ops = sum(
        a["store"]["operations"] - b["store"]["operations"]
        for a, b in zip(after, before, strict=True)
    )
    return {
        "throughput": done / elapsed,
        "p50_us": p50 * 1e6,
        "commits_per_turn": commits / max(1, done),
        "writes_per_turn": ops / max(1, done),
        "pg_xacts_per_turn": (x1 - x0) / max(1, done),
        "round_trips_per_turn": trips / max(1, done),
        "daemon_cpu_ms_per_turn": (cpu1 - cpu0) * 1000 / max(1, done),
        "server_cpu_ms_per_turn": (s1 - s0) * 1000 / max(1, done),
    }


async def run_all() -> None:
    base = Path(tempfile.mkdtemp(prefix="hh-bench-fleet-"))
    os.chmod(base, 0o711)
    rows: dict[str, dict[str, float]] = {}
    try:
        async with pg_cluster() as cluster:
            started = time.perf_counter()
            rows["sqlite, 1 daemon"] = await _row(base, 1, None, None)
            for count in (1, 2, 3):
                dsn = await fresh_database(cluster, f"fleet{count}")
                rows[f"postgres, {count} daemon{'s' if count > 1 else ''}"] = await _row(
                    base, count, dsn, cluster
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = sys.stdout.write
    out(f"fleet benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    out(
        f"{'engine, daemons':22} {'turns/s':>9} {'vs base':>8} {'p50 us':>9} {'commits/t':>10}"
        f" {'writes/t':>9} {'pg xact/t':>10} {'trips/t':>8} {'cpu ms/t':>9} {'pg cpu/t':>9}\n"
    )
    base_row = rows["sqlite, 1 daemon"]
    for name, row in rows.items():
        out(
            f"{name:22} {row['throughput']:9.0f} {row['throughput'] / base_row['throughput']:7.2f}x"
            f" {row['p50_us']:9.0f} {row['commits_per_turn']:10.3f} {row['writes_per_turn']:9.2f}"
            f" {row['pg_xacts_per_turn']:10.3f} {row['round_trips_per_turn']:8.2f}"
            f" {row['daemon_cpu_ms_per_turn']:9.2f} {row['server_cpu_ms_per_turn']:9.2f}\n"
        )
    out(f"total benchmark time {time.perf_counter() - started:.1f} s\n")


def main() -> int:
    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args()
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(run_all)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
