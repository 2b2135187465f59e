"""The daemon's cost with deep queues and many executors: ``benchmarks/bench_scale.py``'s
measurement (its submit and measure functions, configuration and turns) at each step.

No peer runs here: each step is compared with the daemon's own figures with nothing queued
and 8 executors, in the same run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import psutil

from benchmarks import bench_scale
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root


@dataclass(frozen=True, slots=True)
class ScaleStep:
    """One step: *count* queued turns or connected extra executors."""

    kind: str  # "baseline", "queued" or "executors"
    count: int
    rss_mb: float
    rss_before_mb: float  # just before the step added its turns or executors
    turns_per_s: list[float]
    cpu_ms_per_turn: list[float]


async def _step(
    kind: str,
    count: int,
    socket: Path,
    sid: str,
    daemon: psutil.Process,
    *,
    repeats: int,
    rss_before: float,
) -> ScaleStep:
    rss = bench_scale._rss_mb(daemon)
    rates: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        rate, cpu = await bench_scale._measure(socket, sid, daemon)
        rates.append(rate)
        cpus.append(cpu)
    return ScaleStep(
        kind=kind,
        count=count,
        rss_mb=rss,
        rss_before_mb=rss_before,
        turns_per_s=rates,
        cpu_ms_per_turn=cpus,
    )


async def scale_run(
    *, depths: Sequence[int], executor_counts: Sequence[int], repeats: int, measure_turns: int
) -> list[ScaleStep]:
    """A real daemon with bench_scale's 8 READ executors; the baseline step, then each queue
    depth (CLICK turns no executor serves, so they stay queued), then each count of extra
    connected executors (cumulative). Each step measures READ turns at 64 in flight
    *repeats* times (*measure_turns* turns each)."""
    bench_scale.MEASURE_TURNS = measure_turns
    bench = bench_scale._load_executor_bench()
    directory = Path(tempfile.mkdtemp(prefix="hh-compare-scale-"))
    root = directory / "root"
    stack = DemoStack(
        root=root, config_path=prepare_root(root, fresh=True, config_text=bench_scale.CONFIG)
    )
    children: list[anyio.abc.Process] = []
    steps: list[ScaleStep] = []
    try:
        daemon = psutil.Process((await stack.start_daemon()).pid)
        socket = stack.control_socket
        ids = [f"noop-{i}" for i in range(bench_scale.EXECUTORS)]
        children.append(
            await bench.spawn(
                "--role",
                "noop",
                "--socket",
                str(stack.executor_socket),
                "--ids",
                ",".join(ids),
                "--slots",
                str(bench_scale.SLOTS),
            )
        )
        async with ControlClient(socket) as client:
            for executor_id in ids:
                await client.call("executors.wait", executor_id=executor_id, timeout_s=30)
            sid = (await client.call("session.open", package_id="demo"))["session_id"]
        await bench_scale._measure(socket, sid, daemon)  # warm-up
        base_rss = bench_scale._rss_mb(daemon)
        steps.append(
            await _step("baseline", 0, socket, sid, daemon, repeats=repeats, rss_before=base_rss)
        )
        queued = 0
        for depth in depths:
            await bench_scale._pipelined(
                socket, {**bench_scale.QUEUED, "session_id": sid}, depth - queued, wait=False
            )
            queued = depth
            steps.append(
                await _step(
                    "queued", depth, socket, sid, daemon, repeats=repeats, rss_before=base_rss
                )
            )
        connected = 0
        execs_rss = bench_scale._rss_mb(daemon)
        for count in executor_counts:
            added = count - connected
            processes = min(10, added)
            per_process = added // processes
            new_ids: list[str] = []
            for p in range(processes):
                batch = [f"many-{count}-{p}-{i}" for i in range(per_process)]
                new_ids.extend(batch)
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
            async with ControlClient(socket) as client:
                for executor_id in new_ids:
                    await client.call("executors.wait", executor_id=executor_id, timeout_s=120)
            connected += len(new_ids)
            await anyio.sleep(1.0)  # let the registrations' garbage settle before reading RSS
            steps.append(
                await _step(
                    "executors",
                    connected,
                    socket,
                    sid,
                    daemon,
                    repeats=repeats,
                    rss_before=execs_rss,
                )
            )
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
            await child.wait()
            await child.aclose()
        await stack.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    return steps
