"""Benchmark of the whole daemon against a raw anyio length-prefixed echo (same run).

Run: ``.venv/bin/python benchmarks/bench_daemon.py`` (well under two minutes on 2 cores);
``--compact`` runs the throughput phases with ``answer: "compact"`` (docs/control-protocol.md
5.4); the latency phase always asks for the full turn (its attempts give the p50 split).
``--sessions N`` spreads the throughput phases' turns over N sessions (the lanes take them in
turn; the minimal loop runs one session per lane, 64); ``--limit DIR`` runs the minimal durable
loop of DIR (``../shared/tools/limit``: its SQLite variant B and its plain-journal variant A)
right after the daemon, in the same window, and prints the daemon's ratios to each.

1. Baseline: the raw anyio echo of ``bench_executors.py`` (two processes, ~290-byte
   length-prefixed orjson frames): p50/p99 round trip and throughput with 64 in flight.
2. Daemon: a real ``hunter serve`` process with its durable store (SQLite WAL,
   synchronous=FULL, group commit; a turn's ending and both its ledger lines in one commit)
   and session ledgers (the files written at once, synced in rounds); 8 no-op
   SDK executor processes (8 slots each). A client process submits instruction turns over
   ``control.sock`` with ``turn.submit`` + ``wait_s`` (one round trip per turn: accepted
   durably, dispatched, answered, decided, ledgers written, answered to the client).
   * latency: one turn in flight at a time, p50/p99 of submit -> final answer;
   * throughput: 64 turns in flight (8 connections x 8 pipelined) for a fixed time, then 256;
   * bytes per turn on control.sock: one submit-and-wait of the same turn in each form, its
     request and answer frames as sent (4-byte header included), in a session of its own.
   The daemon logs at level "warning" here (at "info" it writes ~6 JSON lines per turn).

Targets (issue 8): daemon turn p50 <= 8x the raw round trip, p99 <= 16x; >= 10,000 turns/s at
64 in flight with 8 executors, more at 256. The report says where the time goes (store writes
per turn and per commit, CPU of the daemon and executor processes).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from supervisor.control.client import ControlClient
from supervisor.stages import ENV as STAGES_ENV
from supervisor.stages import STAGES
from supervisor.wire.frames import encode_frame

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks import bench_executors  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    cpu_seconds,
    noop,
    percentile,
    pipelined,
    running_daemon,
)
from benchmarks.limit_loop import LimitFigures, run_limit  # noqa: E402

LATENCY_TURNS = 400
WARMUP_TURNS = 50
THROUGHPUT_SECONDS = 6.0
IN_FLIGHT = 64
CONNECTIONS = 8
EXECUTORS = 8
SLOTS = 8

TURN: dict[str, Any] = {
    "kind": "instruction",
    "command_type": "READ",
    "target_selector": "#main-content .article-title",
    "timeout_ms": 5000,
    "parameters": {"attribute": "data-title", "max_items": 10},
    "declared_outputs": [],
}


async def _frame_bytes(socket: Path, params: dict[str, Any]) -> tuple[int, int]:
    """One ``turn.submit`` with *params* on a connection of its own: the bytes of its request
    frame and of the answer frame (4-byte header included), as they cross the socket."""
    request = encode_frame({"id": 1, "op": "turn.submit", "params": params})
    async with await anyio.connect_unix(socket) as raw:
        await raw.send(request)
        data = b""
        with anyio.fail_after(30):
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                data += await raw.receive()
    return len(request), len(data)


async def daemon_figures(
    directory: Path, *, compact: bool = False, sessions: int = 1
) -> dict[str, float]:
    # The daemon counts the CPU of each stage of a turn's path (supervisor/stages.py).
    async with running_daemon(
        base=directory,
        env={STAGES_ENV: "1"},
        executors=[[f"noop-{i}" for i in range(EXECUTORS)]],
        spawn=noop(SLOTS),
    ) as daemon:
        sid = daemon.sid
        async with ControlClient(daemon.control_socket) as client:
            samples: list[float] = []
            phases: dict[str, list[float]] = {"intake": [], "attempt": [], "finish": []}
            for i in range(WARMUP_TURNS + LATENCY_TURNS):
                start = time.perf_counter()
                result = await client.call("turn.submit", session_id=sid, wait_s=30, **TURN)
                if i >= WARMUP_TURNS:
                    samples.append(time.perf_counter() - start)
                    t = result["turn"]
                    (a,) = t["attempts"]
                    phases["intake"].append((a["started_us"] - t["accepted_us"]) / 1e6)
                    phases["attempt"].append((a["finished_us"] - a["started_us"]) / 1e6)
                    phases["finish"].append((t["finished_us"] - a["finished_us"]) / 1e6)
                assert result["turn"]["state"] == "succeeded", result["turn"]
            # Bytes per turn, in a session of its own (the main session's figures stay as
            # they were): the same turn submitted and waited for in each form.
            other = (await client.call("session.open", package_id="demo"))["session_id"]
            full = {"session_id": other, "wait_s": 30, **TURN}
            bytes_full = await _frame_bytes(daemon.control_socket, full)
            bytes_compact = await _frame_bytes(daemon.control_socket, {**full, "answer": "compact"})
            sids = [sid]
            for _ in range(sessions - 1):
                opened = await client.call("session.open", package_id="demo")
                sids.append(opened["session_id"])
            before = await client.call("status")

        (executors,) = daemon.executors
        cpu0, ecpu0 = daemon.cpu_s(), cpu_seconds([executors.pid])
        done, failed, elapsed = await _throughput(daemon.control_socket, sids, IN_FLIGHT, compact)
        cpu1, ecpu1 = daemon.cpu_s(), cpu_seconds([executors.pid])
        middle = await daemon.call("status")
        done_256, failed_256, elapsed_256 = await _throughput(
            daemon.control_socket, sids, 256, compact
        )
        after = await daemon.call("status")
        verify = await daemon.call("ledger.verify", session_id=sid)
        assert verify["ok"], verify
        turns = after["store"]["operations"] - before["store"]["operations"]
        batches = after["store"]["commits"] - before["store"]["commits"]
        finished = done + failed + done_256 + failed_256
        rss_mb = daemon.rss_mb()
    daemon_cpu = cpu1 - cpu0
    exec_cpu = ecpu1 - ecpu0
    stage_us = {
        stage: (middle["stages"]["stages"][stage]["ns"] - before["stages"]["stages"][stage]["ns"])
        / 1000
        / max(1, done + failed)
        for stage in STAGES
    }
    return {
        **{f"stage_{stage}_us": us for stage, us in stage_us.items()},
        "phase_intake_us": percentile(phases["intake"], 0.5) * 1e6,
        "phase_attempt_us": percentile(phases["attempt"], 0.5) * 1e6,
        "phase_finish_us": percentile(phases["finish"], 0.5) * 1e6,
        "p50_us": percentile(samples, 0.5) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
        "throughput": done / elapsed,
        "throughput_256": done_256 / elapsed_256,
        "failed": failed + failed_256,
        "intake_ops_per_turn": turns / max(1, finished),
        "intake_ops_per_batch": turns / max(1, batches),
        "daemon_cpu_ms_per_turn": daemon_cpu * 1000 / max(1, done + failed),
        "daemon_cpu_share": daemon_cpu / elapsed,
        "executor_cpu_share": exec_cpu / elapsed,
        "ledger_entries": sum(float(r["entries"]) for r in verify["ledgers"]),
        "rss_mb": rss_mb,
        "request_bytes": bytes_full[0],
        "request_bytes_compact": bytes_compact[0],
        "answer_bytes": bytes_full[1],
        "answer_bytes_compact": bytes_compact[1],
    }


async def _throughput(
    socket: Path, sids: list[str], in_flight: int, compact: bool = False
) -> tuple[int, int, float]:
    """Turns at *in_flight* over 8 connections for THROUGHPUT_SECONDS: (done, failed, s); the
    lanes take the sessions of *sids* in turn. *compact*: the answers carry the compact turn
    (``answer: "compact"``)."""
    form: dict[str, Any] = {"answer": "compact"} if compact else {}
    done = 0
    failed = 0
    lanes = 0
    deadline = time.perf_counter() + THROUGHPUT_SECONDS

    async def lane(conn: ControlClient) -> None:
        nonlocal done, failed, lanes
        sid = sids[lanes % len(sids)]
        lanes += 1
        while time.perf_counter() < deadline:
            r = await conn.call("turn.submit", session_id=sid, wait_s=30, **TURN, **form)
            if r["turn"]["state"] == "succeeded":
                done += 1
            else:
                failed += 1

    elapsed = await pipelined(socket, CONNECTIONS, in_flight // CONNECTIONS, lane)
    return done, failed, elapsed


def fsync_floor(directory: Path, rounds: int = 300) -> float:
    """p50 of a 512-byte append + fdatasync on the benchmark's disk (seconds)."""
    path = directory / "fsync.probe"
    samples: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            os.write(fd, b"x" * 512)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - start)
    finally:
        os.close(fd)
    return percentile(samples, 0.5)


async def run_all(*, compact: bool = False, sessions: int = 1, limit: Path | None = None) -> None:
    directory = Path(tempfile.mkdtemp(prefix="hh-bench-daemon-"))
    os.chmod(directory, 0o711)  # process turns would run as another uid: keep it traversable
    try:
        started = time.perf_counter()
        base = await bench_executors.baseline(directory)
        sync_s = fsync_floor(directory)
        daemon = await daemon_figures(directory, compact=compact, sessions=sessions)
        loops = [] if limit is None else await anyio.to_thread.run_sync(run_limit, limit)
        total = time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = daemon["p50_us"] / base["p50_us"]
    out = sys.stdout.write
    out(f"daemon benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)\n")
    out("baseline: raw anyio length-prefixed echo, two processes\n")
    out(
        f"  round trip p50 / p99                 {base['p50_us']:8.1f} / {base['p99_us']:8.1f} us\n"
    )
    out(f"  throughput, 64 in flight             {base['throughput']:8.0f} msg/s\n")
    out("daemon: turn.submit(wait) -> intake -> hub -> no-op executor -> policy -> ledgers\n")
    out(
        f"  turn p50 / p99 (1 in flight)         {daemon['p50_us']:8.1f} / "
        f"{daemon['p99_us']:8.1f} us\n"
    )
    p99_ratio = daemon["p99_us"] / base["p99_us"]
    out(f"  p50 ratio to raw round trip          {ratio:8.2f} x   (target <= 8)\n")
    out(f"  p99 ratio to raw round trip          {p99_ratio:8.2f} x   (target <= 16)\n")
    rest = daemon["p50_us"] - (
        daemon["phase_intake_us"] + daemon["phase_attempt_us"] + daemon["phase_finish_us"]
    )
    out(f"  p50 split: submit, accept commit     {daemon['phase_intake_us']:8.1f} us\n")
    out(f"             attempt (hub+executor)    {daemon['phase_attempt_us']:8.1f} us\n")
    out(f"             decide, seal, to store    {daemon['phase_finish_us']:8.1f} us\n")
    out(f"             ending commit + replies   {rest:8.1f} us\n")
    out(
        f"  throughput, 64 in flight, 8 execs    {daemon['throughput']:8.0f} turns/s"
        f"   (target >= 10000; {daemon['failed']:.0f} not succeeded)\n"
    )
    out(f"  throughput, 256 in flight, 8 execs   {daemon['throughput_256']:8.0f} turns/s\n")
    if compact:
        out('  (throughput phases with answer="compact")\n')
    out(f"  sessions the throughput turns ran in {sessions:8d}\n")
    out(
        f"  bytes per turn on control.sock: request {daemon['request_bytes']:.0f}"
        f" ({daemon['request_bytes_compact']:.0f} with answer=compact),"
        f" answer {daemon['answer_bytes']:.0f} (full) / {daemon['answer_bytes_compact']:.0f}"
        " (compact)\n"
    )
    out("where the time goes\n")
    out(f"  fdatasync p50 on this disk           {sync_s * 1e6:8.1f} us\n")
    out(
        "  durable steps on a turn's path       2 (accept; the ending with both ledger lines,"
        f" one group commit) >= {2 * sync_s * 1e6:.0f} us\n"
    )
    out(f"  daemon CPU per turn                  {daemon['daemon_cpu_ms_per_turn']:8.2f} ms\n")
    out("  daemon CPU per turn by stage (64 in flight; supervisor/stages.py):\n")
    staged = 0.0
    for stage in STAGES:
        us = daemon[f"stage_{stage}_us"]
        staged += us
        out(f"    {stage:<34} {us:8.1f} us\n")
    rest_us = daemon["daemon_cpu_ms_per_turn"] * 1000 - staged
    out(f"    {'sum of the stages':<34} {staged:8.1f} us\n")
    out(f"    {'the rest (loop, tasks, I/O, files)':<34} {rest_us:8.1f} us\n")
    daemon_share = daemon["daemon_cpu_share"] * 100
    executor_share = daemon["executor_cpu_share"] * 100
    out(f"  daemon process CPU                   {daemon_share:8.0f} % of one core\n")
    out(f"  executor process CPU                 {executor_share:8.0f} % of one core\n")
    out(f"  intake operations per turn           {daemon['intake_ops_per_turn']:8.2f}\n")
    out(f"  intake operations per commit (fsync) {daemon['intake_ops_per_batch']:8.2f}\n")
    out(f"  ledger entries written and verified  {daemon['ledger_entries']:8.0f}\n")
    out(f"  daemon RSS                           {daemon['rss_mb']:8.1f} MB\n")
    _limit_report(daemon, loops)
    out(f"total benchmark time                   {total:8.1f} s\n")


def _limit_report(daemon: dict[str, float], loops: list[LimitFigures]) -> None:
    """The minimal loop's figures, measured right after the daemon's, and the ratios."""
    if not loops:
        return
    out = sys.stdout.write
    out("the minimal durable loop (../shared/tools/limit), same window, 64 sessions\n")
    out("  variant              turns/s @64  @256   p50 @1    CPU/turn @64  verified\n")
    for loop in loops:
        out(
            f"  {loop.variant:<20} {loop.throughput:9.0f} {loop.throughput_256:6.0f}"
            f" {loop.p50_us:7.0f} us {loop.cpu_us_per_turn:9.0f} us   {loop.verified}\n"
        )
    cpu_us = daemon["daemon_cpu_ms_per_turn"] * 1000
    for loop in loops:
        out(
            f"  daemon / {loop.variant:<18}"
            f" throughput @64 {daemon['throughput'] / loop.throughput:5.2f}x"
            f", @256 {daemon['throughput_256'] / max(1.0, loop.throughput_256):5.2f}x"
            f", CPU per turn {cpu_us / loop.cpu_us_per_turn:5.2f}x\n"
        )
    out("  (targets, issue 30: throughput @64 >= 0.8x the SQLite loop B, CPU per turn <= 2x)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--compact",
        action="store_true",
        help='run the throughput phases with answer="compact" (the compact turn object)',
    )
    parser.add_argument(
        "--sessions",
        type=int,
        default=1,
        help="sessions the throughput turns are spread over (default 1; the minimal loop: 64)",
    )
    parser.add_argument(
        "--limit",
        type=Path,
        default=None,
        help="the minimal durable loop's folder (../shared/tools/limit): run it beside the daemon",
    )
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error("--sessions must be at least 1")
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    anyio.run(
        functools.partial(run_all, compact=args.compact, sessions=args.sessions, limit=args.limit)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
