"""Does a flood from one tenant slow another tenant down? (fair dispatch, issue 11)

Run: ``.venv/bin/python benchmarks/bench_fairness.py [--flood 2000] [--work-ms 50]`` (about two
minutes on 2 cores, most of it the "one queue" case, where each of B's turns waits for the
whole flood).

Each case starts a real ``hunter serve`` (durable SQLite store, session ledgers) and
``EXECUTORS`` SDK executor processes of ``SLOTS`` slots each whose READ takes ``--work-ms`` (a
stand-in for real work: with instant executors the daemon's CPU, not the queue order, is what a
flood saturates). Tenant A opens four sessions and keeps ``--flood`` READ turns queued (as many
pipelined ``turn.submit`` + ``wait_s`` calls, each replaced as it ends); tenant B submits one
turn at a time and waits for it. B's p50 (submit -> final answer) is measured first with A idle,
then under the flood:

* **fair**: A's sessions are opened with ``tenant="a"``, B's with ``tenant="b"``: parked turns
  start in round robin across the tenants.
* **one queue**: every session is opened with ``tenant="shared"``: they queue as one tenant,
  oldest first, which is how every parked turn started before fair dispatch (one FIFO per
  command type). B's turn waits behind the whole flood, so this case measures only a few.

Target: B's p50 under the flood at most 2x its p50 without it (fair case). Every figure comes
from this run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psutil

from supervisor.control.client import ControlClient
from supervisor.sdk import Backoff, Executor, Instruction, Result, run_executor

SCRIPT = Path(__file__).resolve()
if str(SCRIPT.parents[1]) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parents[1]))  # ``benchmarks.*`` below, run as a script

from benchmarks.harness import Spawn, running_daemon  # noqa: E402

EXECUTORS = 4
SLOTS = 2
#: tenant A's sessions (its flood is spread over them; fairness is per tenant)
A_SESSIONS = 4
#: pipelined calls per client connection (the server allows 256)
PER_CONNECTION = 200
B_TURNS = 40
#: in the "one queue" case each of B's turns waits for the whole flood
B_TURNS_ONE_QUEUE = 5
WARMUP = 5

CONFIG = """\
drain_grace_s = 1.0
[executors]
queue_capacity = 1000000
queue_wait_s = 86400.0
heartbeat_interval_s = 30.0
[log]
format = "json"
level = "warning"
"""

TURN: dict[str, Any] = {
    "kind": "instruction",
    "command_type": "READ",
    "target_selector": "#main-content .article-title",
    "timeout_ms": 600_000,  # a flooded turn may wait minutes for a slot
    "parameters": {"attribute": "data-title", "max_items": 10},
    "declared_outputs": [],
}


# --------------------------------------------------------------------------- executor role


class Worker(Executor):
    """Answers every READ with success after ``work_s`` (slots bound how many at once)."""

    def __init__(self, *, executor_id: str, slots: int, work_s: float) -> None:
        super().__init__(executor_id=executor_id, slots=slots)
        self.work_s = work_s

    async def read(self, instruction: Instruction) -> Result:
        await anyio.sleep(self.work_s)
        return Result.success(instruction.instruction_id)


async def _workers(path: str, ids: list[str], slots: int, work_s: float) -> None:
    backoff = Backoff(initial_s=0.05, max_s=1.0)

    async def one(worker: Worker) -> None:
        await run_executor(worker, socket_path=path, backoff=backoff)

    async with anyio.create_task_group() as tg:
        for executor_id in ids:
            tg.start_soon(one, Worker(executor_id=executor_id, slots=slots, work_s=work_s))


def _child(args: argparse.Namespace) -> int:
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(_workers, args.socket, args.ids.split(","), SLOTS, args.work_ms / 1000)
    return 0


# --------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class CaseResult:
    name: str
    quiet: list[Sample]
    flooded: list[Sample]
    flood_rate: float
    queued: int


def _p50(samples: Sequence[float]) -> float:
    return statistics.median(samples)


@dataclass(frozen=True)
class Sample:
    """One of B's turns: milliseconds from submit to the final answer, and where they went
    (from the turn's own record: accepted -> first attempt started -> last attempt answered
    -> ended)."""

    total_ms: float
    waited_ms: float
    attempt_ms: float
    ending_ms: float


async def _one_at_a_time(socket: Path, sid: str, count: int) -> list[Sample]:
    """B: *count* turns, one at a time."""
    samples: list[Sample] = []
    async with ControlClient(socket) as client:
        for _ in range(count):
            start = time.perf_counter()
            reply = await client.call("turn.submit", session_id=sid, wait_s=900, **TURN)
            total = (time.perf_counter() - start) * 1000
            turn = reply["turn"]
            assert turn["state"] == "succeeded", turn
            first, last = turn["attempts"][0], turn["attempts"][-1]
            samples.append(
                Sample(
                    total_ms=total,
                    waited_ms=(first["started_us"] - turn["accepted_us"]) / 1000,
                    attempt_ms=(last["finished_us"] - first["started_us"]) / 1000,
                    ending_ms=(turn["finished_us"] - last["finished_us"]) / 1000,
                )
            )
    return samples


class Flood:
    """A: keeps *depth* turns submitted (pipelined submit + wait, each replaced as it ends)."""

    def __init__(self, socket: Path, sessions: list[str], depth: int) -> None:
        self.socket = socket
        self.sessions = sessions
        self.depth = depth
        self.done = 0
        self.stop = anyio.Event()

    async def run(self) -> None:
        lanes = self.depth
        async with anyio.create_task_group() as tg:
            c = 0
            while lanes > 0:
                n = min(PER_CONNECTION, lanes)
                tg.start_soon(self._connection, n, self.sessions[c % len(self.sessions)])
                lanes -= n
                c += 1

    async def _connection(self, lanes: int, sid: str) -> None:
        async with ControlClient(self.socket) as client:

            async def lane() -> None:
                while True:
                    await client.call("turn.submit", session_id=sid, wait_s=900, **TURN)
                    self.done += 1

            async with anyio.create_task_group() as tg:
                for _ in range(lanes):
                    tg.start_soon(lane)
                await self.stop.wait()
                # the lanes stop waiting; their turns stay queued until the daemon stops
                tg.cancel_scope.cancel()


async def _active(client: ControlClient) -> int:
    status = await client.call("status")
    return int(status["in_flight_total"])


def _spawn_workers(work_ms: int) -> Spawn:
    """This script's worker role: the group's executors in one process, SLOTS slots each, a
    READ taking *work_ms*."""

    async def spawn(socket: Path, ids: Sequence[str]) -> anyio.abc.Process:
        return await anyio.open_process(
            [
                *(sys.executable, str(SCRIPT), "--role", "worker"),
                *("--socket", str(socket), "--ids", ",".join(ids), "--work-ms", str(work_ms)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None,
        )

    return spawn


async def run_case(name: str, tenants: tuple[str, str], *, depth: int, work_ms: int) -> CaseResult:
    async with running_daemon(
        config=CONFIG,
        prefix="hh-bench-fair-",
        executors=[[f"w{i}" for i in range(EXECUTORS)]],
        spawn=_spawn_workers(work_ms),
        session=False,
    ) as daemon:
        socket = daemon.control_socket
        a_sessions = [await daemon.open_session(tenant=tenants[0]) for _ in range(A_SESSIONS)]
        b = await daemon.open_session(tenant=tenants[1])
        async with ControlClient(socket) as client:
            await _one_at_a_time(socket, b, WARMUP)
            quiet = await _one_at_a_time(socket, b, B_TURNS)
            flood = Flood(socket, a_sessions, depth)
            async with anyio.create_task_group() as tg:
                tg.start_soon(flood.run)
                with anyio.fail_after(120):
                    while await _active(client) < depth * 0.95:  # noqa: ASYNC110 - polls the daemon
                        await anyio.sleep(0.2)  # the flood ramping up (a benchmark, not a test)
                queued = await _active(client)
                done0, t0 = flood.done, time.perf_counter()
                count = B_TURNS if name == "fair" else B_TURNS_ONE_QUEUE
                flooded = await _one_at_a_time(socket, b, count)
                rate = (flood.done - done0) / (time.perf_counter() - t0)
                flood.stop.set()
        return CaseResult(name, quiet, flooded, rate, queued)


async def run(depth: int, work_ms: int) -> None:
    capacity = EXECUTORS * SLOTS * 1000 / work_ms
    print(
        f"fairness benchmark (python {sys.version.split()[0]}, {psutil.cpu_count()} cpus):"
        f" {EXECUTORS} executors x {SLOTS} slots, READ takes {work_ms} ms"
        f" (at most {capacity:.0f} turns/s); tenant A keeps {depth} turns queued over"
        f" {A_SESSIONS} sessions, tenant B submits one at a time"
    )
    cases = [
        await run_case("fair", ("a", "b"), depth=depth, work_ms=work_ms),
        await run_case("one queue", ("shared", "shared"), depth=depth, work_ms=work_ms),
    ]
    print(
        f"  {'case':<10} {'B p50 alone':>12} {'B p50 flooded':>14} {'ratio':>7}"
        f" {'B max flooded':>14} {'A turns/s':>10} {'A queued':>9}  samples"
    )
    for c in cases:
        alone, flooded = _p50(_ms(c.quiet, "total")), _p50(_ms(c.flooded, "total"))
        print(
            f"  {c.name:<10} {alone:>10.1f}ms {flooded:>12.1f}ms {flooded / alone:>6.2f}x"
            f" {max(_ms(c.flooded, 'total')):>12.1f}ms {c.flood_rate:>10.0f} {c.queued:>9}"
            f"  {len(c.quiet)}/{len(c.flooded)}"
        )
    print("  where B's p50 goes (ms): waiting for a slot / the attempt / the ending's commit")
    for c in cases:
        for label, samples in (("alone", c.quiet), ("flooded", c.flooded)):
            parts = " / ".join(
                f"{_p50(_ms(samples, part)):.1f}" for part in ("waited", "attempt", "ending")
            )
            print(f"  {c.name:<10} {label:<8} {parts}")
    fair, one = cases
    fair_p50 = _p50(_ms(fair.flooded, "total"))
    ratio = fair_p50 / _p50(_ms(fair.quiet, "total"))
    print(
        f"  target: fair ratio <= 2x: {'met' if ratio <= 2 else 'NOT met'} ({ratio:.2f}x);"
        f" one queue makes B wait {_p50(_ms(one.flooded, 'total')) / fair_p50:.0f}x longer"
        " than fair under the same flood"
    )


def _ms(samples: Sequence[Sample], part: str) -> list[float]:
    return [float(getattr(s, f"{part}_ms")) for s in samples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--flood", type=int, default=2000, help="turns tenant A keeps queued")
    parser.add_argument("--work-ms", type=int, default=50, help="how long a READ takes")
    parser.add_argument("--role", choices=["worker"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        return _child(args)
    started = time.perf_counter()
    anyio.run(run, args.flood, args.work_ms)
    print(f"total benchmark time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
