"""Benchmark of the executor SDK against a minimal hand-written executor loop (same run).

Run: ``.venv/bin/python benchmarks/bench_sdk.py`` (about half a minute on 2 cores);
``--rounds 3`` repeats every phase and prints each round; ``--profile FILE`` writes a cProfile
of the SDK process during the first phase.

Both sides are real: this process runs the daemon's executor side (``ExecutorHub`` with its
framing, Phase-20 safety rules and outcome mapping, as in ``bench_executors.py``), and one
child process connects 8 executors of 8 slots each to it, the layout of ``bench_daemon.py``
(where ``docs/performance.md``'s "SDK executors' CPU per instruction" comes from). What is
measured is the CPU (user + system) of the child process per instruction answered.

1. SDK: ``supervisor.sdk.run_executor`` with a no-op READ handler (``Result.success`` of the
   instruction id, so the evidence hash and timestamp are computed as by any executor).
2. Baseline: the same 8 x 8 executors as a minimal hand-written loop in plain asyncio on the
   same socket: hello, then per chunk read every frame it holds, answer each instruction with
   the same response (sha256 of the id, a timestamp), one write per chunk, a heartbeat timer.
   It is what an executor costs with no SDK at all: no handler dispatch, no cancellation, no
   tracing, no tasks.

Each is measured at 64 instructions in flight (as fast as the hub goes) and paced at
``--rate`` instructions a second (2,000 by default: what the daemon does at 64 in flight).

Target (issue 30): the SDK at most 60 us of CPU per instruction.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import hashlib
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import anyio.abc
import orjson
import psutil

from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from sandbox.policy.safety import build_executor_instruction
from supervisor.executors.hub import ExecutorHub, HubSettings, open_executor_listener
from supervisor.sdk import Backoff, Executor, Instruction, Result, run_executor

SCRIPT = Path(__file__).resolve()
IN_FLIGHT = 64
EXECUTORS = 8
SLOTS = 8
SECONDS = 4.0
WARMUP_S = 0.5
RATE = 2000.0
_HEADER = struct.Struct(">I")


# --------------------------------------------------------------------------- child roles


class NoOp(Executor):
    async def read(self, instruction: Instruction) -> Result:
        return Result.success(instruction.instruction_id)


async def sdk_executors(path: str, ids: list[str], slots: int) -> None:
    backoff = Backoff(initial_s=0.05, max_s=1.0)

    async def one(executor: NoOp) -> None:
        await run_executor(executor, socket_path=path, backoff=backoff)

    async with anyio.create_task_group() as tg:
        for executor_id in ids:
            tg.start_soon(one, NoOp(executor_id=executor_id, slots=slots))


def _answer(instruction_id: str) -> bytes:
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    body = orjson.dumps(
        {
            "type": "response",
            "response": {
                "instruction_id": instruction_id,
                "response_type": "SUCCESS",
                "evidence_hash": hashlib.sha256(instruction_id.encode()).hexdigest(),
                "error_message": "",
                "timestamp": stamp,
                "output": {},
                "partial": False,
            },
        }
    )
    return _HEADER.pack(len(body)) + body


async def raw_executor(path: str, executor_id: str, slots: int) -> None:
    """The baseline: one executor connection as a minimal plain-asyncio loop."""
    reader, writer = await asyncio.open_unix_connection(path)
    hello = {
        "type": "hello",
        "executor_id": executor_id,
        "protocol_version": 1,
        "commands": ["READ"],
        "slots": slots,
        "software": "raw-baseline",
    }
    body = orjson.dumps(hello)
    writer.write(_HEADER.pack(len(body)) + body)
    buffer = b""
    interval = 5.0

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(interval)
            beat = orjson.dumps({"type": "heartbeat", "ts_us": time.time_ns() // 1000})
            writer.write(_HEADER.pack(len(beat)) + beat)

    beats: asyncio.Task[None] | None = None
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            buffer += chunk
            out: list[bytes] = []
            start = 0
            while len(buffer) - start >= 4:
                (size,) = _HEADER.unpack_from(buffer, start)
                end = start + 4 + size
                if end > len(buffer):
                    break
                frame = orjson.loads(buffer[start + 4 : end])
                start = end
                kind = frame.get("type")
                if kind == "instruction":
                    out.append(_answer(frame["instruction"]["instruction_id"]))
                elif kind == "welcome":
                    interval = frame["heartbeat_interval_ms"] / 1000
                    beats = asyncio.get_running_loop().create_task(heartbeats())
            buffer = buffer[start:]
            if out:
                writer.write(b"".join(out))
    finally:
        if beats is not None:
            beats.cancel()
        writer.close()


async def raw_executors(path: str, ids: list[str], slots: int) -> None:
    await asyncio.gather(*(raw_executor(path, executor_id, slots) for executor_id in ids))


def child_main(args: argparse.Namespace) -> int:
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    ids = args.ids.split(",")
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        # SIGUSR1 starts the profile, SIGUSR2 stops it and writes the stats.
        signal.signal(signal.SIGUSR1, lambda *_: profile.enable())

        def dump(*_: object) -> None:
            profile.disable()
            profile.dump_stats(args.profile)

        signal.signal(signal.SIGUSR2, dump)
    if args.role == "raw":
        asyncio.run(raw_executors(args.socket, ids, args.slots))
    else:
        anyio.run(sdk_executors, args.socket, ids, args.slots)
    return 0


# --------------------------------------------------------------------------- measurements


async def spawn(*argv: str) -> anyio.abc.Process:
    return await anyio.open_process(
        [sys.executable, str(SCRIPT), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None,
    )


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


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def _drive(hub: ExecutorHub, *, seconds: float, rate: float | None) -> tuple[int, int]:
    """64 attempts in flight for *seconds* (paced at *rate* a second when given): (done,
    faults)."""
    done = faults = 0
    ticket = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(k: int) -> None:
        nonlocal done, faults, ticket
        env = _envelope(k)
        while True:
            if rate is not None:
                due = start + ticket / rate
                ticket += 1
                if due >= deadline:
                    return
                delay = due - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)
            elif time.perf_counter() >= deadline:
                return
            report = await hub.run_attempt(env)
            done += 1
            if report.outcome.fault_type is not None:
                faults += 1

    async with anyio.create_task_group() as tg:
        for k in range(IN_FLIGHT):
            tg.start_soon(worker, k)
    return done, faults


async def measure(
    directory: Path, role: str, *, rate: float, profile: str | None = None
) -> dict[str, float]:
    """One child process of *role* (``sdk`` or ``raw``): its figures at 64 in flight, then
    paced at *rate*."""
    path = directory / f"{role}.sock"
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(path)
    ids = [f"{role}-{n}" for n in range(EXECUTORS)]
    argv = ["--role", role, "--socket", str(path), "--ids", ",".join(ids), "--slots", str(SLOTS)]
    if profile:
        argv += ["--profile", profile]
    figures: dict[str, float] = {}
    process = await spawn(*argv)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(hub.serve, listener)
            with anyio.fail_after(30):
                for executor_id in ids:
                    await hub.wait_for_executor(executor_id)
            child = psutil.Process(process.pid)
            await _drive(hub, seconds=WARMUP_S, rate=None)
            for name, pace in (("flat", None), ("paced", rate)):
                if profile and name == "flat":
                    os.kill(process.pid, signal.SIGUSR1)
                cpu0, wall0 = _cpu(child), time.perf_counter()
                done, faults = await _drive(hub, seconds=SECONDS, rate=pace)
                cpu1, wall1 = _cpu(child), time.perf_counter()
                if profile and name == "flat":
                    os.kill(process.pid, signal.SIGUSR2)
                figures[f"{name}_rate"] = done / (wall1 - wall0)
                figures[f"{name}_cpu_us"] = (cpu1 - cpu0) / max(1, done) * 1e6
                figures[f"{name}_share"] = (cpu1 - cpu0) / (wall1 - wall0)
                figures[f"{name}_faults"] = faults
            await hub.aclose()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        await process.aclose()
        await listener.aclose()
    return figures


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:8.1f}"
    return f"{statistics.median(values):8.1f}   ({min(values):.1f}-{max(values):.1f})"


async def run_all(*, rounds: int, rate: float, profile: str | None) -> None:
    directory = Path(tempfile.mkdtemp(prefix="hh-bench-sdk-"))
    runs: list[tuple[dict[str, float], dict[str, float]]] = []
    out = sys.stdout.write
    started = time.perf_counter()
    try:
        for n in range(rounds):
            sdk = await measure(directory, "sdk", rate=rate, profile=profile if n == 0 else None)
            raw = await measure(directory, "raw", rate=rate)
            runs.append((sdk, raw))
            if rounds > 1:
                out(
                    f"round {n + 1}: sdk {sdk['flat_cpu_us']:.1f} us at {sdk['flat_rate']:.0f}/s,"
                    f" raw {raw['flat_cpu_us']:.1f} us at {raw['flat_rate']:.0f}/s;"
                    f" paced sdk {sdk['paced_cpu_us']:.1f} us, raw {raw['paced_cpu_us']:.1f} us\n"
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    total = time.perf_counter() - started

    def col(side: int, key: str) -> list[float]:
        return [run[side][key] for run in runs]

    out(f"SDK executor benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    out(
        f"{EXECUTORS} executors x {SLOTS} slots in one process <- ExecutorHub.run_attempt,"
        f" {IN_FLIGHT} in flight; executor process CPU per instruction"
        f" (median (min-max) of {rounds})\n"
    )
    for name, title in (("flat", "as fast as the hub goes"), ("paced", f"paced at {rate:.0f}/s")):
        out(f"{IN_FLIGHT} in flight, {title}\n")
        out(f"  instructions/s (sdk)                {_spread(col(0, f'{name}_rate'))}\n")
        out(f"  instructions/s (raw)                {_spread(col(1, f'{name}_rate'))}\n")
        out(f"  SDK CPU per instruction             {_spread(col(0, f'{name}_cpu_us'))} us\n")
        out(f"  raw loop CPU per instruction        {_spread(col(1, f'{name}_cpu_us'))} us\n")
        ratios = [
            s / r for s, r in zip(col(0, f"{name}_cpu_us"), col(1, f"{name}_cpu_us"), strict=True)
        ]
        out(f"  ratio SDK / raw                     {_spread(ratios)} x\n")
        faults = sum(col(0, f"{name}_faults")) + sum(col(1, f"{name}_faults"))
        out(f"  faults                              {faults:8.0f}\n")
    out("target (issue 30): SDK at most 60 us of CPU per instruction\n")
    out(f"load average at the end               {os.getloadavg()[0]:8.2f}\n")
    out(f"total benchmark time                  {total:8.1f} s\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--role", choices=["sdk", "raw"], default=None)
    parser.add_argument("--socket", default="")
    parser.add_argument("--ids", default="")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--profile", default="", help="cProfile stats of the SDK process")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rate", type=float, default=RATE)
    args = parser.parse_args()
    if args.role is not None:
        return child_main(args)
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="warning", stream=sys.stderr)
    anyio.run(lambda: run_all(rounds=args.rounds, rate=args.rate, profile=args.profile or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
