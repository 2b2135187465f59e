"""The client library's cost to a client: turns/s through `supervisor.client.Client` against
the raw connection (`ControlClient.call` with hand-built params), same daemon, same run.

Run: ``.venv/bin/python benchmarks/bench_client.py`` (about a minute on 2 cores).

One daemon (embedded store, 8 no-op SDK executors, as ``bench_daemon.py``); a client submits
READ turns and waits for each (``wait_s``: one round trip a turn) at 64 in flight over 8
connections for a fixed window, in interleaved rounds: raw, then the library (typed spec in,
typed `Turn` out), then the library giving each submission an idempotency key of its own
(its default). Printed:
turns/s and client CPU per turn of each, and the library's ratio to raw (target >= 0.90,
issue 21).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks.bench_daemon import CONNECTIONS, EXECUTORS, IN_FLIGHT, SLOTS, TURN  # noqa: E402
from benchmarks.harness import noop, own_cpu, running_daemon  # noqa: E402
from supervisor.client import Client  # noqa: E402
from supervisor.control.client import ControlClient  # noqa: E402

WINDOW_S = 6.0
LANES = IN_FLIGHT // CONNECTIONS
_PARAMS: dict[str, Any] = {k: v for k, v in TURN.items() if k not in {"kind", "command_type"}}


async def _raw(socket: Path, sid: str) -> int:
    done = 0
    deadline = time.perf_counter() + WINDOW_S

    async def connection() -> None:
        nonlocal done
        async with ControlClient(socket) as conn, anyio.create_task_group() as tg:

            async def lane() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    answer = await conn.call(
                        "turn.submit", session_id=sid, wait_s=30, answer="compact", **TURN
                    )
                    assert answer["turn"]["state"] == "succeeded"
                    done += 1

            for _ in range(LANES):
                tg.start_soon(lane)

    async with anyio.create_task_group() as tg:
        for _ in range(CONNECTIONS):
            tg.start_soon(connection)
    return done


async def _library(socket: Path, sid: str, *, keys: bool) -> int:
    """*keys*: the client gives each submission an idempotency key of its own (its default:
    safe to send again after a lost connection; the daemon looks each key up in the
    transaction that accepts the turn). Without: the client's ``auto_keys=False``."""
    done = 0
    deadline = time.perf_counter() + WINDOW_S
    selector = str(_PARAMS["target_selector"])
    parameters = dict(_PARAMS["parameters"])

    async def connection() -> None:
        nonlocal done
        async with Client(socket, auto_keys=keys) as client, anyio.create_task_group() as tg:

            async def lane() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    handle = await client.submit_instruction(
                        sid,
                        "READ",
                        selector=selector,
                        parameters=parameters,
                        timeout_ms=5000,
                        wait_s=30,
                        compact=True,
                    )
                    assert handle.turn.succeeded
                    done += 1

            for _ in range(LANES):
                tg.start_soon(lane)

    async with anyio.create_task_group() as tg:
        for _ in range(CONNECTIONS):
            tg.start_soon(connection)
    return done


async def run(rounds: int) -> None:
    rows: list[tuple[str, float, float]] = []
    async with running_daemon(
        executors=[[f"noop-{i}" for i in range(EXECUTORS)]], spawn=noop(SLOTS)
    ) as daemon:
        socket, sid = daemon.control_socket, daemon.sid
        await _raw(socket, sid)  # warm up
        for r in range(rounds):
            order = ["raw", "library", "library, keys"]
            order = order if r % 2 == 0 else order[::-1]
            for name in order:
                cpu0 = own_cpu()
                start = time.perf_counter()
                if name == "raw":
                    done = await _raw(socket, sid)
                else:
                    done = await _library(socket, sid, keys=name.endswith("keys"))
                elapsed = time.perf_counter() - start
                rows.append((name, done / elapsed, (own_cpu() - cpu0) * 1e6 / max(1, done)))
    write = sys.stdout.write
    write(f"client library benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    write("client                 turns/s   client CPU/turn\n")
    for name, rate, cpu in rows:
        write(f"{name:<20} {rate:9.0f}   {cpu:12.0f} us\n")
    raw = sum(rate for name, rate, _ in rows if name == "raw")
    lib = sum(rate for name, rate, _ in rows if name == "library")
    raw_cpu = sum(cpu for name, _, cpu in rows if name == "raw")
    lib_cpu = sum(cpu for name, _, cpu in rows if name == "library")
    keyed = sum(rate for name, rate, _ in rows if name == "library, keys")
    write(f"library / raw: throughput {lib / raw:.2f}x (target >= 0.90),")
    write(f" client CPU per turn {lib_cpu / raw_cpu:.2f}x\n")
    write(f"library with its own idempotency keys / raw: throughput {keyed / raw:.2f}x,")
    write(f" / library without keys {keyed / lib:.2f}x (target >= 0.90)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    args = parser.parse_args(argv)
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(functools.partial(run, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
