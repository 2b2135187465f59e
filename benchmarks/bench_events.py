"""What following the change feed costs the daemon (``events.subscribe``), against no
subscriber in the same run.

Run: ``.venv/bin/python benchmarks/bench_events.py`` (about a minute on 2 cores;
``--subscribers N``, ``--rounds R``).

One daemon (embedded store, 8 no-op SDK executors, as ``bench_daemon.py``), and a client
submitting READ turns at 64 in flight for a fixed window, in interleaved rounds: with no
subscriber, then with N subscribers (default 100) following every event, held by a child
process that reads their sockets as raw bytes (so that parsing on the subscribers' side does
not compete with the daemon for the two cores more than reading must). Printed per round:
turns/s, daemon CPU per turn, events and bytes delivered, subscribers cut off; then the ratio
of throughput and CPU with the subscribers to without (target: the console's 50 browsers
cost less than 5 %, issue 22; the feed itself is what they share).
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
from benchmarks.harness import noop, pipelined, running_daemon  # noqa: E402
from supervisor.control.client import ControlClient  # noqa: E402
from supervisor.wire.frames import encode_frame  # noqa: E402

WINDOW_S = 6.0


async def _subscribers(socket: str, count: int) -> None:
    """The child: *count* connections subscribed to every event, read as raw bytes until
    stdin closes; prints "ready" once subscribed, then the bytes read."""
    total = [0]
    streams = []
    for i in range(count):
        stream = await anyio.connect_unix(socket)
        await stream.send(encode_frame({"id": i + 1, "op": "events.subscribe", "params": {}}))
        streams.append(stream)
    print("ready", flush=True)

    async def drain(stream: anyio.abc.SocketStream) -> None:
        try:
            while True:
                data = await stream.receive(1 << 20)  # then count: `+=` would read before the await
                total[0] += len(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return

    async with anyio.create_task_group() as tg:
        for stream in streams:
            tg.start_soon(drain, stream)
        await anyio.to_thread.run_sync(sys.stdin.read)
        tg.cancel_scope.cancel()
    print(total[0], flush=True)


async def _window(socket: Path, sid: str) -> int:
    done = 0
    deadline = time.perf_counter() + WINDOW_S

    async def lane(conn: ControlClient) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await conn.call("turn.submit", session_id=sid, wait_s=30, answer="compact", **TURN)
            done += 1

    await pipelined(socket, CONNECTIONS, IN_FLIGHT // CONNECTIONS, lane)
    return done


async def run(subscribers: int, rounds: int) -> None:
    rows: list[dict[str, Any]] = []
    async with running_daemon(
        executors=[[f"noop-{i}" for i in range(EXECUTORS)]], spawn=noop(SLOTS)
    ) as daemon:
        socket = daemon.control_socket
        await _window(socket, daemon.sid)  # warm up
        for r in range(rounds):
            for n in (0, subscribers) if r % 2 == 0 else (subscribers, 0):
                child = None
                if n:
                    child = await anyio.open_process(
                        [sys.executable, __file__, "--child", str(socket), str(n)]
                    )
                    assert child.stdout is not None
                    with anyio.fail_after(30):
                        await child.stdout.receive()  # "ready"
                before = await daemon.call("status")
                cpu0 = daemon.cpu_s()
                start = time.perf_counter()
                done = await _window(socket, daemon.sid)
                elapsed = time.perf_counter() - start
                cpu = daemon.cpu_s() - cpu0
                after = await daemon.call("status")
                delivered = 0
                if child is not None:
                    assert child.stdin is not None
                    assert child.stdout is not None
                    await child.stdin.aclose()
                    text = b""
                    with anyio.fail_after(60):
                        async for chunk in child.stdout:
                            text += chunk
                    await child.wait()
                    delivered = int(text.split()[-1])
                rows.append(
                    {
                        "subscribers": n,
                        "turns_s": done / elapsed,
                        "cpu_us": cpu * 1e6 / max(1, done),
                        "events": after["events"]["published"] - before["events"]["published"],
                        "bytes": delivered,
                        "cut": after["events"]["cut_off"] - before["events"]["cut_off"],
                    }
                )
    write = sys.stdout.write
    write(f"event feed benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    write("subscribers  turns/s  daemon CPU/turn  events/turn  MB delivered  cut off\n")
    for row in rows:
        write(
            f"{row['subscribers']:11d}  {row['turns_s']:7.0f}  {row['cpu_us']:12.0f} us"
            f"  {row['events'] / max(1, row['turns_s'] * WINDOW_S):11.2f}"
            f"  {row['bytes'] / 1e6:12.1f}  {row['cut']:7d}\n"
        )
    base = [r for r in rows if r["subscribers"] == 0]
    loaded = [r for r in rows if r["subscribers"]]
    tput = sum(r["turns_s"] for r in loaded) / sum(r["turns_s"] for r in base)
    cpu = sum(r["cpu_us"] for r in loaded) / sum(r["cpu_us"] for r in base)
    write(
        f"with {subscribers} subscribers: throughput {tput:.2f}x, daemon CPU per turn {cpu:.2f}x\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        anyio.run(_subscribers, args[1], int(args[2]))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--subscribers", type=int, default=100, help="subscribers (default 100)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parsed = parser.parse_args(args)
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(functools.partial(run, parsed.subscribers, parsed.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
