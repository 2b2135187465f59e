"""The daemon's cost with deep queues and many executors: ``benchmarks/bench_scale.py``'s
measurement (its submit and measure functions, configuration and turns) at each step.

No peer runs here: each step is compared with the daemon's own figures with nothing queued
and 8 executors, in the same run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from benchmarks import bench_scale
from benchmarks.harness import BenchDaemon, noop


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
    kind: str, count: int, daemon: BenchDaemon, *, repeats: int, rss_before: float
) -> ScaleStep:
    rss = daemon.rss_mb()
    rates: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        rate, cpu = await bench_scale._measure(daemon)
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
    steps: list[ScaleStep] = []
    async with bench_scale.scale_daemon(prefix="hh-compare-scale-") as daemon:
        await bench_scale._measure(daemon)  # warm-up
        base_rss = daemon.rss_mb()
        steps.append(await _step("baseline", 0, daemon, repeats=repeats, rss_before=base_rss))
        queued = 0
        for depth in depths:
            await bench_scale._pipelined(
                daemon.control_socket,
                {**bench_scale.QUEUED, "session_id": daemon.sid},
                depth - queued,
                wait=False,
            )
            queued = depth
            steps.append(await _step("queued", depth, daemon, repeats=repeats, rss_before=base_rss))
        connected = 0
        execs_rss = daemon.rss_mb()
        for count in executor_counts:
            added = count - connected
            processes = min(10, added)
            per_process = added // processes
            batches = [
                [f"many-{count}-{p}-{i}" for i in range(per_process)] for p in range(processes)
            ]
            await daemon.add_executors(batches, noop(1), timeout_s=120)
            connected += sum(len(batch) for batch in batches)
            await anyio.sleep(1.0)  # let the registrations' garbage settle before reading RSS
            steps.append(
                await _step("executors", connected, daemon, repeats=repeats, rss_before=execs_rss)
            )
    return steps
