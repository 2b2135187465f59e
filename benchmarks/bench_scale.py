"""How the daemon scales with queued work and with connected executors (same run, same machine).

Run: ``.venv/bin/python benchmarks/bench_scale.py [--queued 20000] [--executors 1000]``
(about two minutes with the defaults on 2 cores; ``--queued 100000`` takes several minutes,
most of it submitting).

1. A real ``hunter serve`` (durable SQLite store, session ledgers) with 8 no-op executors that
   serve READ only. Baseline: daemon RSS and the cost of READ turns (turns/s and daemon CPU per
   turn at 64 in flight) with nothing queued.
2. Queue depth: CLICK turns are submitted that no connected executor serves, so they stay
   accepted and queued (``executors.queue_wait_s`` is set far beyond the run). At each step
   (1,000, then 10x up to ``--queued``) the same READ measurement runs again beside them: the
   per-turn CPU should stay flat, and RSS grows by what a queued turn costs.
3. Executors: ``--executors`` more no-op executor connections (10 processes) register; the daemon
   RSS per connected executor is the growth divided by their number. They serve READ too (one
   slot each, and least-loaded dispatch prefers them), so they take most of the measured turns:
   each instruction then goes out alone on its connection instead of batched with others, which
   costs the daemon more per turn (a syscall and a reader wake-up each). Connections that only
   serve a command no measured turn asks for are the idle case.

Every figure comes from this run; ratios are against the step-1 baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil

from supervisor.control.client import ControlClient

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks.harness import BenchDaemon, noop, pipelined, running_daemon  # noqa: E402

IN_FLIGHT = 64
CONNECTIONS = 8
MEASURE_TURNS = 3000
EXECUTORS = 8
SLOTS = 8

CONFIG = """\
drain_grace_s = 5.0
[executors]
queue_capacity = 1000000
queue_wait_s = 86400.0
heartbeat_interval_s = 30.0
[log]
format = "json"
level = "warning"
"""

READ: dict[str, Any] = {
    "kind": "instruction",
    "command_type": "READ",
    "target_selector": "#main-content .article-title",
    "timeout_ms": 5000,
    "parameters": {"attribute": "data-title", "max_items": 10},
    "declared_outputs": [],
}
QUEUED: dict[str, Any] = {
    **READ,
    "command_type": "CLICK",
    "timeout_ms": 600_000,
    "target_selector": "#never-served",
}


def scale_daemon(
    prefix: str = "hh-bench-scale-",
) -> contextlib.AbstractAsyncContextManager[BenchDaemon]:
    """The daemon of step 1: CONFIG, EXECUTORS no-op executors of SLOTS slots (READ only) in
    one process, a session."""
    return running_daemon(
        config=CONFIG,
        prefix=prefix,
        executors=[[f"noop-{i}" for i in range(EXECUTORS)]],
        spawn=noop(SLOTS),
    )


async def _pipelined(socket: Path, params: dict[str, Any], count: int, *, wait: bool) -> float:
    """Submit *count* turns over 8 connections with 64 in flight; seconds taken."""
    left = count

    async def lane(conn: ControlClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if wait:
                r = await conn.call("turn.submit", wait_s=30, **params)
                assert r["turn"]["state"] == "succeeded", r["turn"]
            else:
                await conn.call("turn.submit", **params)

    return await pipelined(socket, CONNECTIONS, IN_FLIGHT // CONNECTIONS, lane)


async def _measure(daemon: BenchDaemon) -> tuple[float, float]:
    """READ turns at 64 in flight: (turns/s, daemon CPU ms per turn)."""
    cpu0 = daemon.cpu_s()
    params = {**READ, "session_id": daemon.sid}
    elapsed = await _pipelined(daemon.control_socket, params, MEASURE_TURNS, wait=True)
    cpu = daemon.cpu_s() - cpu0
    return MEASURE_TURNS / elapsed, cpu * 1000 / MEASURE_TURNS


async def run(queued_max: int, extra_executors: int) -> None:
    print(f"daemon scale benchmark (python {sys.version.split()[0]}, {psutil.cpu_count()} cpus)")
    async with scale_daemon() as daemon:
        socket, sid = daemon.control_socket, daemon.sid
        await _measure(daemon)  # warm-up
        base_rss = daemon.rss_mb()
        base_rate, base_cpu = await _measure(daemon)
        print("queue depth (CLICK turns accepted, no executor serves them)")
        print(f"  {'queued':>8}  {'RSS MB':>8}  {'KB/queued':>9}  {'READ turns/s':>12}"
              f"  {'CPU ms/turn':>11}  {'CPU vs 0':>8}  {'submit/s':>8}")  # fmt: skip
        print(f"  {0:>8}  {base_rss:>8.1f}  {'':>9}  {base_rate:>12.0f}  {base_cpu:>11.3f}"
              f"  {1.0:>7.2f}x  {'':>8}")  # fmt: skip
        queued = 0
        step = 1000
        while queued < queued_max:
            target = min(step, queued_max)
            took = await _pipelined(
                socket, {**QUEUED, "session_id": sid}, target - queued, wait=False
            )
            submit_rate = (target - queued) / took
            queued = target
            rss = daemon.rss_mb()
            rate, cpu = await _measure(daemon)
            per_turn_kb = (rss - base_rss) * 1000 / queued
            print(f"  {queued:>8}  {rss:>8.1f}  {per_turn_kb:>9.2f}  {rate:>12.0f}  {cpu:>11.3f}"
                  f"  {cpu / base_cpu:>7.2f}x  {submit_rate:>8.0f}")  # fmt: skip
            step *= 10
        status = await daemon.call("status")
        print(f"  store counts: {status.get('turns_by_state', {})}")

        print(f"executors: {extra_executors} more no-op connections (10 processes)")
        before = daemon.rss_mb()
        per_process = max(1, extra_executors // 10)
        batches = [[f"many-{p}-{i}" for i in range(per_process)] for p in range(10)]
        await daemon.add_executors(batches, noop(1), timeout_s=60)
        added = sum(len(batch) for batch in batches)
        await anyio.sleep(1.0)
        after = daemon.rss_mb()
        print(f"  daemon RSS {before:.1f} -> {after:.1f} MB with {added} more executors:"
              f" {(after - before) * 1000 / added:.1f} KB per executor")  # fmt: skip
        rate, cpu = await _measure(daemon)
        print(
            f"  READ turns/s {rate:.0f}, CPU {cpu:.3f} ms/turn ({cpu / base_cpu:.2f}x the"
            " baseline) with them connected"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--queued", type=int, default=20_000, help="deepest queue (turns)")
    parser.add_argument("--executors", type=int, default=1000, help="extra executors")
    args = parser.parse_args()
    started = time.perf_counter()
    anyio.run(run, args.queued, args.executors)
    print(f"total benchmark time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
