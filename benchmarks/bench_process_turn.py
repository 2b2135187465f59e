"""A ``/bin/true`` process turn beside a bare ``posix_spawn`` of it, same run (issue 30's
process-turn targets: a turn through the daemon at most 3x the bare spawn, the sandboxed turn
standalone at most 2x).

Rows, each the median of *--turns* runs one at a time (as root, on a machine with Landlock and
cgroups):

1. ``posix_spawn("/bin/true")`` and ``waitpid``: the baseline.
2. The confined launcher alone: the session's uid, network namespace, cgroup leaf, rlimits,
   Landlock ruleset and seccomp filter, spawned and reaped (no checks, enumeration or ledger).
3. The sandboxed turn standalone (``sandbox.runtime``): checks, confinement, the attempt loop,
   write enumeration, both ledger entries written and synced, the sandbox dirs emptied.
4. Through the daemon: a real ``hunter serve`` (embedded store), the client library's
   ``submit_process(..., wait_s=...)`` from another process: accepted durably, run as row 3,
   its ending and both ledger lines committed in the store, answered.

CPU per turn is printed beside row 4 (the daemon's process and its children).

    .venv/bin/python benchmarks/bench_process_turn.py [--turns 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import structlog

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks.bench_sandbox import confined_spawn_timer  # noqa: E402
from benchmarks.harness import cpu_seconds, percentile, running_daemon  # noqa: E402
from sandbox.runtime import Runtime  # noqa: E402
from supervisor.client import Client  # noqa: E402

TURN_TARGET = 2.0
DAEMON_TARGET = 3.0
WARMUP = 20


def bare_spawn() -> None:
    """posix_spawn /bin/true and wait for it."""
    pid = os.posix_spawn("/bin/true", ["true"], {})
    os.waitpid(pid, 0)


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Run *fn* *n* times; each call's duration in ms."""
    out: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def standalone(work: Path, turns: int) -> tuple[list[float], list[float], str]:
    """Rows 2 and 3 on a fresh root under *work*; the enforcement levels."""
    root = work / "root"
    package = root / "installed" / "bench"
    package.mkdir(parents=True)
    manifest = {"capabilities": {"read": [], "write": ["**"], "execute": ["/bin/true"]}}
    (package / "manifest.json").write_text(json.dumps(manifest))
    with Runtime(root) as runtime, runtime.open_session("bench") as session:
        levels = ",".join(f"{k}={v}" for k, v in sorted(runtime.levels.items()))
        ms: list[float] = []
        for n in range(WARMUP + turns):
            started = time.perf_counter()
            result = await session.run_process_turn(
                ["/bin/true"], declared_outputs=[], timeout_ms=5000
            )
            if n >= WARMUP:
                ms.append((time.perf_counter() - started) * 1000)
            if result.status != "succeeded":
                raise RuntimeError(f"turn failed: {result.to_dict()}")
        launcher = timed(confined_spawn_timer(session), turns)
    return launcher, ms, levels


async def through_daemon(turns: int) -> tuple[list[float], float]:
    """Row 4: each turn's submit-to-answer time in ms; the daemon's CPU per turn in ms."""
    async with (
        running_daemon(session=False, prefix="hh-bench-proc-") as daemon,
        Client(daemon.control_socket) as client,
    ):
        sid = (await client.open_session("demo")).session_id
        ms: list[float] = []
        cpu_before = 0.0
        for n in range(WARMUP + turns):
            if n == WARMUP:
                cpu_before = cpu_seconds([daemon.process.pid])
            started = time.perf_counter()
            handle = await client.submit_process(sid, ["/bin/true"], wait_s=30, compact=True)
            if n >= WARMUP:
                ms.append((time.perf_counter() - started) * 1000)
            if handle.turn.state != "succeeded":
                raise RuntimeError(f"turn did not succeed: {handle.turn}")
        cpu = cpu_seconds([daemon.process.pid]) - cpu_before
    return ms, cpu / turns * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300, help="runs per row (default 300)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--daemon-only",
        action="store_true",
        help="only row 4 and its baseline (to profile the daemon: py-spy record --pid ...)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_process_turn.py runs as root (turns drop to per-session uids)")
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    work = Path(tempfile.mkdtemp(prefix="hh-bench-proc-"))
    work.chmod(0o711)
    try:
        timed(bare_spawn, WARMUP)
        bare_first = timed(bare_spawn, args.turns)
        launcher, turn, levels = (
            ([], [], "not measured")
            if args.daemon_only
            else anyio.run(standalone, work, args.turns)
        )
        daemon, cpu_ms = anyio.run(through_daemon, args.turns)
        bare = bare_first + timed(bare_spawn, args.turns)  # before and after the others
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(bare)
    rows = {
        "bare posix_spawn": bare,
        "confined launcher alone": launcher,
        "sandboxed turn, standalone": turn,
        "process turn through the daemon": daemon,
    }
    figures = {
        name: {
            "p50_ms": round(statistics.median(samples), 3),
            "p90_ms": round(percentile(samples, 0.9), 3),
            "ratio": round(statistics.median(samples) / base, 2),
        }
        for name, samples in rows.items()
        if samples
    }
    if args.json:
        print(json.dumps({"enforcement": levels, "rows": figures, "daemon_cpu_ms": cpu_ms}))
        return 0
    print(f"enforcement: {levels}")
    print(f"/bin/true, {args.turns} runs a row, one at a time (ms)")
    print(f"{'':34} {'p50':>7} {'p90':>7} {'x bare':>7}")
    targets = {
        "sandboxed turn, standalone": TURN_TARGET,
        "process turn through the daemon": DAEMON_TARGET,
    }
    for name, row in figures.items():
        target = targets.get(name)
        mark = "" if target is None else f"  (target <= {target:.1f}x)"
        print(f"{name:34} {row['p50_ms']:7.3f} {row['p90_ms']:7.3f} {row['ratio']:7.2f}{mark}")
    print(f"daemon CPU per process turn: {cpu_ms:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
