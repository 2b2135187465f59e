"""Dispatch of no-op work: the daemon's instruction turns and Celery tasks, measured alike.

Both sides get the same number of workers (``workers`` processes, each doing one task at a
time), the same closed-loop client in the benchmark process (``in_flight`` lanes, each submitting
one task and waiting for its answer before the next), the same warm-up and window, and the same
figures: throughput over the window, p50/p99 of submit -> answer, CPU per task of the server
side (all its processes) and of the client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_daemon
from benchmarks.harness import (
    REPO,
    BenchDaemon,
    cpu_seconds,
    noop,
    own_cpu,
    percentile,
    pipelined,
    running_daemon,
)
from benchmarks.peers.celery_app import TASK_NAME, make_app
from benchmarks.peers.redis_server import RedisServer, redis_server
from supervisor.control.client import ControlClient


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One in-flight level of one run."""

    in_flight: int
    throughput: float
    p50_us: float
    p99_us: float
    server_cpu_us: float
    client_cpu_us: float
    tasks: int


class Window:
    """Latencies of the tasks started after the warm-up, and when the last one ended."""

    def __init__(self, *, warm_s: float, seconds: float) -> None:
        now = time.perf_counter()
        self.start = now + warm_s
        self.end = self.start + seconds
        self.samples: list[float] = []
        self.last_end = self.start
        self.total = 0
        self.lock = threading.Lock()

    def record(self, started: float, ended: float) -> None:
        with self.lock:
            self.total += 1
            if started >= self.start:
                self.samples.append(ended - started)
                self.last_end = max(self.last_end, ended)

    def result(self, in_flight: int, server_cpu: float, client_cpu: float) -> LevelResult:
        if not self.samples:
            raise RuntimeError(f"no task finished in the window at {in_flight} in flight")
        return LevelResult(
            in_flight=in_flight,
            throughput=len(self.samples) / (self.last_end - self.start),
            p50_us=percentile(self.samples, 0.5) * 1e6,
            p99_us=percentile(self.samples, 0.99) * 1e6,
            server_cpu_us=server_cpu / self.total * 1e6,
            client_cpu_us=client_cpu / self.total * 1e6,
            tasks=len(self.samples),
        )


# --------------------------------------------------------------------------- the daemon


@contextlib.asynccontextmanager
async def daemon_stack(workers: int) -> AsyncIterator[BenchDaemon]:
    """A real ``hunter serve`` (``harness.BENCH_CONFIG``, bench_daemon's: durable SQLite store,
    session ledgers) and *workers* no-op SDK executor processes, one executor with one slot
    each, and an open session; the session's ledgers must verify afterwards."""
    async with running_daemon(
        prefix="hh-compare-daemon-",
        executors=[[f"noop-{i}"] for i in range(workers)],
        spawn=noop(1),
    ) as daemon:
        yield daemon
        verify = await daemon.call("ledger.verify", session_id=daemon.sid)
        if not verify["ok"]:
            raise RuntimeError(f"the session's ledgers do not verify: {verify}")


async def daemon_level(
    daemon: BenchDaemon,
    pids: Sequence[int],
    *,
    in_flight: int,
    warm_s: float,
    seconds: float,
) -> LevelResult:
    """No-op READ instruction turns, ``turn.submit`` with ``wait_s``, *in_flight* at a time
    over up to 8 control connections."""
    connections = min(in_flight, 8)
    window = Window(warm_s=warm_s, seconds=seconds)
    failed: list[object] = []

    async def lane(conn: ControlClient) -> None:
        while (started := time.perf_counter()) < window.end:
            reply = await conn.call(
                "turn.submit", session_id=daemon.sid, wait_s=30, **bench_daemon.TURN
            )
            window.record(started, time.perf_counter())
            if reply["turn"]["state"] != "succeeded":
                failed.append(reply["turn"])

    server0, client0 = cpu_seconds(pids), own_cpu()
    await pipelined(daemon.control_socket, connections, in_flight // connections, lane)
    server1, client1 = cpu_seconds(pids), own_cpu()
    if failed:
        raise RuntimeError(f"{len(failed)} turns did not succeed, first: {failed[0]}")
    return window.result(in_flight, server1 - server0, client1 - client0)


async def daemon_round(
    *, workers: int, levels: Sequence[int], warm_s: float, seconds: float
) -> list[LevelResult]:
    """Start the daemon, measure every level, stop it."""
    async with daemon_stack(workers) as daemon:
        return [
            await daemon_level(daemon, daemon.pids, in_flight=n, warm_s=warm_s, seconds=seconds)
            for n in levels
        ]


# --------------------------------------------------------------------------- Celery


@contextlib.contextmanager
def celery_workers(
    server: RedisServer, *, durable: bool, pool: str, workers: int, log: Path
) -> Iterator[list[int]]:
    """Real Celery workers on *server*: ``--pool=prefork -c workers`` (one main process and
    *workers* children) or *workers* ``--pool=solo`` processes. Yields their pids once every
    node answers a ping; stops them (SIGTERM, then SIGKILL) when the block ends."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HH_CELERY_REDIS": server.url,
        "HH_CELERY_DURABLE": "1" if durable else "0",
    }
    base = [sys.executable, "-m", "celery", "-A", "benchmarks.peers.celery_app", "worker"]
    if pool == "prefork":
        commands = [[*base, "--pool=prefork", "-c", str(workers), "-n", "hh0@%h"]]
    else:
        commands = [[*base, "--pool=solo", "-n", f"hh{i}@%h"] for i in range(workers)]
    processes: list[subprocess.Popen[bytes]] = []
    app = make_app(server.url, durable=durable)
    try:
        with log.open("ab") as out:
            for command in commands:
                processes.append(
                    subprocess.Popen(
                        [*command, "--loglevel=WARNING"],
                        cwd=REPO,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 60
        while len(app.control.ping(timeout=0.5)) < len(commands):
            dead = [p for p in processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Celery workers did not come up:\n{tail}")
        # every worker process has run a task (prefork children are forked and warm)
        for result in [app.send_task(TASK_NAME) for _ in range(4 * workers)]:
            result.get(timeout=30)
        yield [p.pid for p in processes]
    finally:
        app.close()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # leftover prefork children


def celery_level(
    url: str,
    durable: bool,
    pids: Sequence[int],
    *,
    in_flight: int,
    warm_s: float,
    seconds: float,
) -> LevelResult:
    """``send_task`` + ``AsyncResult.get`` in *in_flight* client threads (Celery keeps a result
    backend, so a Redis connection and subscription, per thread)."""
    app = make_app(url, durable=durable)
    window = Window(warm_s=warm_s, seconds=seconds)
    errors: list[BaseException] = []

    def lane() -> None:
        try:
            while (started := time.perf_counter()) < window.end:
                app.send_task(TASK_NAME).get(timeout=30)
                window.record(started, time.perf_counter())
        except Exception as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(in_flight)]
    server0, client0 = cpu_seconds(pids), own_cpu()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server1, client1 = cpu_seconds(pids), own_cpu()
    app.close()
    if errors:
        raise RuntimeError(f"{len(errors)} Celery client lanes failed") from errors[0]
    return window.result(in_flight, server1 - server0, client1 - client0)


def celery_round(
    *, durable: bool, pool: str, workers: int, levels: Sequence[int], warm_s: float, seconds: float
) -> list[LevelResult]:
    """Start Redis and the workers, measure every level, stop them."""
    with redis_server(durable=durable) as server:
        log = server.directory / "celery.log"
        with celery_workers(server, durable=durable, pool=pool, workers=workers, log=log) as pids:
            measure: Callable[[int], LevelResult] = lambda n: celery_level(  # noqa: E731
                server.url, durable, [*pids, server.pid], in_flight=n, warm_s=warm_s,
                seconds=seconds,
            )  # fmt: skip
            return [measure(n) for n in levels]
