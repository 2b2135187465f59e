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
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import anyio.abc
import psutil

from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root

HERE = Path(__file__).resolve().parent
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


def _load_executor_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_executors", HERE / "bench_executors.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _pipelined(socket: Path, params: dict[str, Any], count: int, *, wait: bool) -> float:
    """Submit *count* turns over 8 connections with 64 in flight; seconds taken."""
    left = count

    async def connection() -> None:
        nonlocal left
        async with ControlClient(socket) as conn:

            async def lane() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    if wait:
                        r = await conn.call("turn.submit", wait_s=30, **params)
                        assert r["turn"]["state"] == "succeeded", r["turn"]
                    else:
                        await conn.call("turn.submit", **params)

            async with anyio.create_task_group() as tg:
                for _ in range(IN_FLIGHT // CONNECTIONS):
                    tg.start_soon(lane)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CONNECTIONS):
            tg.start_soon(connection)
    return time.perf_counter() - start


async def _measure(socket: Path, sid: str, daemon: psutil.Process) -> tuple[float, float]:
    """READ turns at 64 in flight: (turns/s, daemon CPU ms per turn)."""
    cpu0 = daemon.cpu_times()
    elapsed = await _pipelined(socket, {**READ, "session_id": sid}, MEASURE_TURNS, wait=True)
    cpu1 = daemon.cpu_times()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return MEASURE_TURNS / elapsed, cpu * 1000 / MEASURE_TURNS


def _rss_mb(process: psutil.Process) -> float:
    rss: int = process.memory_info().rss
    return rss / 1e6


async def run(queued_max: int, extra_executors: int) -> None:
    bench = _load_executor_bench()
    directory = Path(tempfile.mkdtemp(prefix="hh-bench-scale-"))
    root = directory / "root"
    stack = DemoStack(root=root, config_path=prepare_root(root, fresh=True, config_text=CONFIG))
    children: list[anyio.abc.Process] = []
    print(f"daemon scale benchmark (python {sys.version.split()[0]}, {psutil.cpu_count()} cpus)")
    try:
        daemon = psutil.Process((await stack.start_daemon()).pid)
        ids = [f"noop-{i}" for i in range(EXECUTORS)]
        children.append(
            await bench.spawn(
                "--role",
                "noop",
                "--socket",
                str(stack.executor_socket),
                "--ids",
                ",".join(ids),
                "--slots",
                str(SLOTS),
            )
        )
        async with ControlClient(stack.control_socket) as client:
            for executor_id in ids:
                await client.call("executors.wait", executor_id=executor_id, timeout_s=20)
            sid = (await client.call("session.open", package_id="demo"))["session_id"]
        await _measure(stack.control_socket, sid, daemon)  # warm-up
        base_rss = _rss_mb(daemon)
        base_rate, base_cpu = await _measure(stack.control_socket, sid, daemon)
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
                stack.control_socket, {**QUEUED, "session_id": sid}, target - queued, wait=False
            )
            submit_rate = (target - queued) / took
            queued = target
            rss = _rss_mb(daemon)
            rate, cpu = await _measure(stack.control_socket, sid, daemon)
            per_turn_kb = (rss - base_rss) * 1000 / queued
            print(f"  {queued:>8}  {rss:>8.1f}  {per_turn_kb:>9.2f}  {rate:>12.0f}  {cpu:>11.3f}"
                  f"  {cpu / base_cpu:>7.2f}x  {submit_rate:>8.0f}")  # fmt: skip
            step *= 10
        async with ControlClient(stack.control_socket) as client:
            status = await client.call("status")
        print(f"  store counts: {status.get('turns_by_state', {})}")

        print(f"executors: {extra_executors} more no-op connections (10 processes)")
        before = _rss_mb(daemon)
        per_process = max(1, extra_executors // 10)
        extra_ids: list[str] = []
        for p in range(10):
            batch = [f"many-{p}-{i}" for i in range(per_process)]
            extra_ids.extend(batch)
            children.append(
                await bench.spawn(
                    "--role",
                    "noop",
                    "--socket",
                    str(stack.executor_socket),
                    "--ids",
                    ",".join(batch),
                    "--slots",
                    "1",
                )
            )
        async with ControlClient(stack.control_socket) as client:
            for executor_id in extra_ids:
                await client.call("executors.wait", executor_id=executor_id, timeout_s=60)
        await anyio.sleep(1.0)
        after = _rss_mb(daemon)
        print(f"  daemon RSS {before:.1f} -> {after:.1f} MB with {len(extra_ids)} more executors:"
              f" {(after - before) * 1000 / len(extra_ids):.1f} KB per executor")  # fmt: skip
        rate, cpu = await _measure(stack.control_socket, sid, daemon)
        print(
            f"  READ turns/s {rate:.0f}, CPU {cpu:.3f} ms/turn ({cpu / base_cpu:.2f}x the"
            " baseline) with them connected"
        )
    finally:
        for child in children:
            child.kill()
            await child.wait()
            await child.aclose()
        await stack.aclose()
        shutil.rmtree(directory, ignore_errors=True)


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
