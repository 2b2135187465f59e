"""Benchmark of the executor hub against a raw anyio length-prefixed echo (same run).

Run: ``.venv/bin/python benchmarks/bench_executors.py`` (about a minute on 2 cores).

1. Baseline: a raw anyio echo of ~290-byte length-prefixed orjson frames between two
   processes over a Unix socket: p50/p99 round trip (one in flight) and throughput with 64 in
   flight (8 connections x 8 pipelined).
2. Hub: instruction attempts through ``ExecutorHub.run_attempt`` to no-op SDK executors in
   other processes: p50/p99 (one in flight, one executor) and throughput with 64 attempts in
   flight over 8 executors (8 slots each). Every response goes through the Phase-20 safety
   rules and the outcome mapping, as in the daemon (no intake, no ledgers: bench_daemon.py adds
   those).
3. RSS of the hub process with 1,000 connected executors (10 processes x 100 connections).

Targets (issue 5): hub p50 <= 4x the raw round trip; >= 10,000 attempts/s at 64 in flight with
8 executors; hub RSS <= 100 MB with 1,000 executors connected.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import psutil
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox.policy.envelopes import ExecutorInstructionEnvelope, ExecutorStatus
from sandbox.policy.safety import build_executor_instruction
from supervisor.executors.hub import ExecutorHub, HubSettings, open_executor_listener
from supervisor.sdk import Backoff, Executor, Instruction, Result, run_executor
from supervisor.wire.frames import encode_frame

SCRIPT = Path(__file__).resolve()
MESSAGE: dict[str, Any] = {
    "type": "instruction",
    "instruction": {
        "instruction_id": "ins-000000000001",
        "execution_id": "exe-000000000001",
        "command_type": "READ",
        "target_url": "",
        "target_selector": "#main-content .article-title",
        "timestamp": "2026-01-01T00:00:00.000000Z",
        "timeout_ms": 5000,
        "parameters": {"attribute": "data-title", "max_items": 10},
    },
}
LATENCY_TURNS = 3000
THROUGHPUT_SECONDS = 4.0
IN_FLIGHT = 64
EXECUTORS = 8
MASS_PROCESSES = 10
MASS_PER_PROCESS = 100


# --------------------------------------------------------------------------- child roles


class RawFrames:
    """The baseline's framing: plain anyio streams (BufferedByteReceiveStream), no hub code."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffered = BufferedByteReceiveStream(stream)

    async def read(self) -> dict[str, Any]:
        (size,) = struct.unpack(">I", await self.buffered.receive_exactly(4))
        obj: dict[str, Any] = orjson.loads(await self.buffered.receive_exactly(size))
        return obj

    async def write(self, obj: object) -> None:
        body = orjson.dumps(obj)
        await self.stream.send(struct.pack(">I", len(body)) + body)


async def echo_server(path: str) -> None:
    listener = await anyio.create_unix_listener(path)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        frames = RawFrames(stream)
        async with stream:
            try:
                while True:
                    await frames.write(await frames.read())
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                return

    async with listener:
        await listener.serve(handle)


class NoOp(Executor):
    async def read(self, instruction: Instruction) -> Result:
        return Result.success(instruction.instruction_id)


async def noop_executors(path: str, ids: list[str], slots: int) -> None:
    backoff = Backoff(initial_s=0.05, max_s=1.0)

    async def one(executor: NoOp) -> None:
        await run_executor(executor, socket_path=path, backoff=backoff)

    async with anyio.create_task_group() as tg:
        for executor_id in ids:
            tg.start_soon(one, NoOp(executor_id=executor_id, slots=slots))


def child_main(args: argparse.Namespace) -> int:
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    if args.role == "echo":
        anyio.run(echo_server, args.socket)
    else:
        anyio.run(noop_executors, args.socket, args.ids.split(","), args.slots)
    return 0


# --------------------------------------------------------------------------- measurements


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def spawn(*argv: str) -> anyio.abc.Process:
    return await anyio.open_process(
        [sys.executable, str(SCRIPT), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None,
    )


async def wait_for_socket(path: Path) -> None:
    with anyio.fail_after(20):
        while True:
            try:
                stream = await anyio.connect_unix(path)
            except OSError:
                await anyio.sleep(0.02)  # polling a child's startup, not synchronising tests
                continue
            await stream.aclose()
            return


async def baseline(directory: Path) -> dict[str, float]:
    path = directory / "echo.sock"
    process = await spawn("--role", "echo", "--socket", str(path))
    try:
        await wait_for_socket(path)
        frame = encode_frame(MESSAGE)
        stream = await anyio.connect_unix(path)
        async with stream:
            frames = RawFrames(stream)
            samples = []
            for i in range(LATENCY_TURNS + 200):
                start = time.perf_counter()
                await frames.write(MESSAGE)
                await frames.read()
                if i >= 200:
                    samples.append(time.perf_counter() - start)
        done = 0
        deadline = time.perf_counter() + THROUGHPUT_SECONDS

        async def pipe() -> None:
            nonlocal done
            conn = await anyio.connect_unix(path)
            async with conn:
                conn_frames = RawFrames(conn)
                window = IN_FLIGHT // 8
                for _ in range(window):
                    await conn_frames.write(MESSAGE)
                outstanding = window
                while outstanding:
                    await conn_frames.read()
                    outstanding -= 1
                    done += 1
                    if time.perf_counter() < deadline:
                        await conn_frames.write(MESSAGE)
                        outstanding += 1

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(pipe)
        elapsed = time.perf_counter() - start
    finally:
        process.kill()
        await process.wait()
        await process.aclose()
    return {
        "p50_us": _pct(samples, 0.5) * 1e6,
        "p99_us": _pct(samples, 0.99) * 1e6,
        "throughput": done / elapsed,
        "frame_bytes": len(frame),
    }


def _envelope(n: int) -> ExecutorInstructionEnvelope:
    return build_executor_instruction(
        instruction_id=f"ins-{n:012d}",
        execution_id=f"exe-{n:012d}",
        command_type="READ",
        target_selector="#main-content .article-title",
        timestamp="2026-01-01T00:00:00.000000Z",
        timeout_ms=5000,
        parameters={"attribute": "data-title", "max_items": 10},
    )


async def hub_figures(directory: Path) -> dict[str, float]:
    path = directory / "hub.sock"
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(path)
    processes: list[anyio.abc.Process] = []
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(hub.serve, listener)
            # latency: one executor, one slot, one attempt at a time
            processes.append(
                await spawn("--role", "noop", "--socket", str(path), "--ids", "lat", "--slots", "1")
            )
            with anyio.fail_after(30):
                await hub.wait_for_executor("lat")
            envelopes = [_envelope(n) for n in range(LATENCY_TURNS + 200)]
            samples = []
            for i, env in enumerate(envelopes):
                start = time.perf_counter()
                report = await hub.run_attempt(env)
                if i >= 200:
                    samples.append(time.perf_counter() - start)
                if report.outcome.fault_type is not None:
                    raise RuntimeError(f"unexpected outcome {report}")
            # throughput: 8 executors x 8 slots, 64 attempts in flight
            ids = [f"tp-{n}" for n in range(EXECUTORS)]
            for executor_id in ids:
                processes.append(
                    await spawn(
                        "--role",
                        "noop",
                        "--socket",
                        str(path),
                        "--ids",
                        executor_id,
                        "--slots",
                        "8",
                    )
                )
            with anyio.fail_after(30):
                for executor_id in ids:
                    await hub.wait_for_executor(executor_id)
            processes[0].kill()  # leave exactly the 8 throughput executors
            with anyio.fail_after(10):
                await hub.wait_for_executor("lat", status=ExecutorStatus.OFFLINE)
            done = 0
            failures = 0
            deadline = time.perf_counter() + THROUGHPUT_SECONDS

            async def worker(k: int) -> None:
                nonlocal done, failures
                env = _envelope(1_000_000 + k)
                while time.perf_counter() < deadline:
                    report = await hub.run_attempt(env)
                    done += 1
                    if report.outcome.fault_type is not None:
                        failures += 1

            executors = [psutil.Process(p.pid) for p in processes[1:]]
            cpu_before = psutil.Process().cpu_times()
            exec_before = [e.cpu_times() for e in executors]
            start = time.perf_counter()
            async with anyio.create_task_group() as workers:
                for k in range(IN_FLIGHT):
                    workers.start_soon(worker, k)
            elapsed = time.perf_counter() - start
            cpu_after = psutil.Process().cpu_times()
            exec_after = [e.cpu_times() for e in executors]
            await hub.aclose()
            tg.cancel_scope.cancel()
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()
            await process.aclose()
        await listener.aclose()
    hub_cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    exec_cpu = sum(
        (a.user + a.system) - (b.user + b.system)
        for a, b in zip(exec_after, exec_before, strict=True)
    )
    return {
        "p50_us": _pct(samples, 0.5) * 1e6,
        "p99_us": _pct(samples, 0.99) * 1e6,
        "throughput": done / elapsed,
        "failures": failures,
        "hub_cpu_share": hub_cpu / elapsed,
        "exec_cpu_share": exec_cpu / elapsed,
        "cpu_us_per_attempt": (hub_cpu + exec_cpu) / max(1, done) * 1e6,
    }


async def rss_figures(directory: Path) -> dict[str, float]:
    path = directory / "mass.sock"
    me = psutil.Process()
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(path)
    processes: list[anyio.abc.Process] = []
    rss_before = me.memory_info().rss
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(hub.serve, listener)
            all_ids: list[str] = []
            for p in range(MASS_PROCESSES):
                ids = [f"m{p}-{n}" for n in range(MASS_PER_PROCESS)]
                all_ids += ids
                processes.append(
                    await spawn(
                        "--role",
                        "noop",
                        "--socket",
                        str(path),
                        "--ids",
                        ",".join(ids),
                        "--slots",
                        "1",
                    )
                )
            start = time.perf_counter()
            with anyio.fail_after(60):
                for executor_id in all_ids:
                    await hub.wait_for_executor(executor_id)
            connect_s = time.perf_counter() - start
            # one attempt per 100 executors, so the connections are really used
            for n, executor_id in enumerate(all_ids[::100]):
                report = await hub.run_attempt(_envelope(5_000_000 + n))
                if report.outcome.fault_type is not None:
                    raise RuntimeError(f"{executor_id}: {report}")
            connected = hub.statistics().executors_connected
            rss_after = me.memory_info().rss
            await hub.aclose()
            tg.cancel_scope.cancel()
    finally:
        for process in processes:
            process.kill()
            await process.wait()
            await process.aclose()
        await listener.aclose()
    return {
        "connected": connected,
        "rss_mb": rss_after / 2**20,
        "rss_before_mb": rss_before / 2**20,
        "connect_s": connect_s,
    }


async def run_all() -> None:
    directory = Path(tempfile.mkdtemp(prefix="hh-bench-"))
    try:
        started = time.perf_counter()
        base = await baseline(directory)
        hub = await hub_figures(directory)
        rss = await rss_figures(directory)
        total = time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = hub["p50_us"] / base["p50_us"]
    out = sys.stdout.write
    out(f"executor hub benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    out(f"  frame size                          {base['frame_bytes']:.0f} bytes\n")
    out("baseline: raw anyio length-prefixed echo, two processes\n")
    out(f"  round trip p50 / p99                {base['p50_us']:8.1f} / {base['p99_us']:8.1f} us\n")
    out(f"  throughput, 64 in flight            {base['throughput']:8.0f} msg/s\n")
    out("hub: run_attempt -> no-op SDK executor processes (safety rules + outcome mapping)\n")
    out(f"  attempt p50 / p99 (1 in flight)     {hub['p50_us']:8.1f} / {hub['p99_us']:8.1f} us\n")
    out(f"  p50 ratio to raw round trip         {ratio:8.2f} x   (target <= 4)\n")
    out(
        f"  throughput, 64 in flight, 8 execs   {hub['throughput']:8.0f} attempts/s"
        f"   (target >= 10000; {hub['failures']:.0f} faults)\n"
    )
    out(f"  hub process CPU during throughput   {hub['hub_cpu_share'] * 100:8.0f} % of one core\n")
    out(f"  executors' CPU (8 processes)        {hub['exec_cpu_share'] * 100:8.0f} % of one core\n")
    cost = hub["cpu_us_per_attempt"]
    out(
        f"  CPU per attempt, hub + executor     {cost:8.1f} us"
        f"   (=> {2e6 / cost:.0f} attempts/s if both cores were free)\n"
    )
    load = os.getloadavg()[0]
    out(f"  load average at the end             {load:8.2f}   (other work on the box)\n")
    out("hub with many executors connected\n")
    out(f"  executors connected                 {rss['connected']:8.0f}\n")
    before, after = rss["rss_before_mb"], rss["rss_mb"]
    out(
        f"  hub RSS before / after              {before:8.1f} / {after:8.1f} MB   (target <= 100)\n"
    )
    out(f"  time to connect all                 {rss['connect_s']:8.2f} s\n")
    out(f"total benchmark time                  {total:8.1f} s\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--role", choices=["echo", "noop"], default=None)
    parser.add_argument("--socket", default="")
    parser.add_argument("--ids", default="")
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args()
    if args.role is not None:
        return child_main(args)
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(run_all)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
