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

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import asyncpg
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from supervisor.control.client import ControlClient  # noqa: E402
from supervisor.demo.stack import DemoStack, prepare_root  # noqa: E402
from supervisor.store.postgres import migrate_database  # noqa: E402
from tests.supervisor.store.pg_cluster import PgCluster, start_cluster, stop_cluster  # noqa: E402

SECONDS = 5.0
IN_FLIGHT = 64
LATENCY_TURNS = 200
EXECUTOR_PROCS = 4
SLOTS = 8

CONFIG = """\
drain_grace_s = 5.0
[executors]
queue_capacity = 100000
heartbeat_interval_s = 5.0
[log]
format = "json"
level = "warning"
"""

TURN: dict[str, Any] = {
    "kind": "instruction",
    "command_type": "READ",
    "target_selector": "#main",
    "timeout_ms": 5000,
    "declared_outputs": [],
}


def _executor_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_executors", HERE / "bench_executors.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Daemon:
    def __init__(self, stack: DemoStack, executors: list[anyio.abc.Process], sid: str) -> None:
        self.stack = stack
        self.executors = executors
        self.sid = sid


async def _start(base: Path, name: str, bench: ModuleType, dsn: str | None) -> Daemon:
    store = "" if dsn is None else f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\n'
    root = base / name
    config = prepare_root(root, fresh=True, config_text=CONFIG + store)
    stack = DemoStack(root=root, config_path=config)
    await stack.start_daemon()
    executors = []
    ids: list[str] = []
    for p in range(EXECUTOR_PROCS):
        group = [f"{name}-noop-{p}-{i}" for i in range(1)]
        ids += group
        executors.append(
            await bench.spawn(
                "--role",
                "noop",
                "--socket",
                str(stack.executor_socket),
                "--ids",
                ",".join(group),
                "--slots",
                str(SLOTS),
            )
        )
    async with ControlClient(stack.control_socket) as client:
        for executor_id in ids:
            await client.call("executors.wait", executor_id=executor_id, timeout_s=20)
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
    return Daemon(stack, executors, sid)


async def _stop(daemon: Daemon) -> None:
    for proc in daemon.executors:
        proc.kill()
        await proc.wait()
        await proc.aclose()
    await daemon.stack.aclose()


async def _latency(daemon: Daemon) -> float:
    samples = []
    async with ControlClient(daemon.stack.control_socket) as client:
        for i in range(30 + LATENCY_TURNS):
            start = time.perf_counter()
            result = await client.call("turn.submit", session_id=daemon.sid, wait_s=30, **TURN)
            assert result["turn"]["state"] == "succeeded", result["turn"]
            if i >= 30:
                samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


async def _throughput(daemons: list[Daemon]) -> tuple[int, float]:
    done = 0
    deadline = time.perf_counter() + SECONDS
    lanes = IN_FLIGHT // (2 * len(daemons))

    async def connection(daemon: Daemon) -> None:
        nonlocal done
        async with ControlClient(daemon.stack.control_socket) as conn:

            async def lane() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    r = await conn.call("turn.submit", session_id=daemon.sid, wait_s=30, **TURN)
                    assert r["turn"]["state"] == "succeeded", r["turn"]
                    done += 1

            async with anyio.create_task_group() as tg:
                for _ in range(lanes):
                    tg.start_soon(lane)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for daemon in daemons:
            for _ in range(2):
                tg.start_soon(connection, daemon)
    return done, time.perf_counter() - start


async def _status(daemon: Daemon) -> dict[str, Any]:
    async with ControlClient(daemon.stack.control_socket) as client:
        return dict(await client.call("status"))


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
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    total = 0.0
    main = psutil.Process(pid)
    for proc in [main, *main.children()]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def _row(
    base: Path, bench: ModuleType, count: int, dsn: str | None, cluster: PgCluster | None
) -> dict[str, float]:
    daemons = []
    try:
        for n in range(count):
            daemons.append(await _start(base, f"d{count}-{n}", bench, dsn))
        p50 = await _latency(daemons[0])
        before = [await _status(d) for d in daemons]
        procs = [psutil.Process(d.stack.daemon.pid) for d in daemons if d.stack.daemon]
        cpu0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        x0 = await _pg_xacts(dsn) if dsn else 0
        s0 = _server_cpu(cluster)
        done, elapsed = await _throughput(daemons)
        s1 = _server_cpu(cluster)
        x1 = await _pg_xacts(dsn) if dsn else 0
        cpu1 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        after = [await _status(d) for d in daemons]
    finally:
        for daemon in daemons:
            await _stop(daemon)
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
    bench = _executor_bench()
    base = Path(tempfile.mkdtemp(prefix="hh-bench-fleet-"))
    os.chmod(base, 0o711)
    cluster: PgCluster = await anyio.to_thread.run_sync(start_cluster)
    started = time.perf_counter()
    rows: dict[str, dict[str, float]] = {}
    try:
        rows["sqlite, 1 daemon"] = await _row(base, bench, 1, None, None)
        for count in (1, 2, 3):
            conn = await asyncpg.connect(cluster.dsn())
            try:
                await conn.execute(f"CREATE DATABASE fleet{count}")
            finally:
                await conn.close()
            dsn = cluster.dsn(f"fleet{count}")
            await migrate_database(dsn)
            rows[f"postgres, {count} daemon{'s' if count > 1 else ''}"] = await _row(
                base, bench, count, dsn, cluster
            )
    finally:
        await anyio.to_thread.run_sync(stop_cluster, cluster)
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
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(run_all)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
