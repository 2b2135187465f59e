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
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import psutil

from benchmarks import bench_daemon
from benchmarks.peers.celery_app import TASK_NAME, make_app
from benchmarks.peers.redis_server import RedisServer, redis_server
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root

REPO = Path(__file__).resolve().parents[2]


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


def percentile(samples: Sequence[float], q: float) -> float:
    """The *q* quantile (nearest rank) of *samples*."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of the processes *pids* and all their descendants."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


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
async def daemon_stack(workers: int) -> AsyncIterator[tuple[DemoStack, str, list[int]]]:
    """A real ``hunter serve`` (bench_daemon's configuration: durable SQLite store, session
    ledgers) and *workers* no-op SDK executor processes, one executor with one slot each;
    yields the stack, an open session and the server-side pids."""
    bench = bench_daemon._load_executor_bench()
    directory = Path(tempfile.mkdtemp(prefix="hh-compare-daemon-"))
    os.chmod(directory, 0o711)
    root = directory / "root"
    stack = DemoStack(
        root=root, config_path=prepare_root(root, fresh=True, config_text=bench_daemon.BENCH_CONFIG)
    )
    executors: list[anyio.abc.Process] = []
    try:
        daemon = await stack.start_daemon()
        ids = [f"noop-{i}" for i in range(workers)]
        for executor_id in ids:
            executors.append(
                await bench.spawn(
                    "--role",
                    "noop",
                    "--socket",
                    str(stack.executor_socket),
                    "--ids",
                    executor_id,
                    "--slots",
                    "1",
                )
            )
        async with ControlClient(stack.control_socket) as client:
            for executor_id in ids:
                await client.call("executors.wait", executor_id=executor_id, timeout_s=30)
            sid = (await client.call("session.open", package_id="demo"))["session_id"]
        yield stack, sid, [daemon.pid, *(e.pid for e in executors)]
        async with ControlClient(stack.control_socket) as client:
            verify = await client.call("ledger.verify", session_id=sid)
        if not verify["ok"]:
            raise RuntimeError(f"the session's ledgers do not verify: {verify}")
    finally:
        for process in executors:
            if process.returncode is None:
                process.kill()
            await process.wait()
            await process.aclose()
        await stack.aclose()
        await anyio.to_thread.run_sync(lambda: _rmtree(directory))


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


async def daemon_level(
    stack: DemoStack,
    sid: str,
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

    async def connection() -> None:
        async with ControlClient(stack.control_socket) as conn:

            async def lane() -> None:
                while (started := time.perf_counter()) < window.end:
                    reply = await conn.call(
                        "turn.submit", session_id=sid, wait_s=30, **bench_daemon.TURN
                    )
                    window.record(started, time.perf_counter())
                    if reply["turn"]["state"] != "succeeded":
                        failed.append(reply["turn"])

            async with anyio.create_task_group() as tg:
                for _ in range(in_flight // connections):
                    tg.start_soon(lane)

    server0, client0 = cpu_seconds(pids), _own_cpu()
    async with anyio.create_task_group() as tg:
        for _ in range(connections):
            tg.start_soon(connection)
    server1, client1 = cpu_seconds(pids), _own_cpu()
    if failed:
        raise RuntimeError(f"{len(failed)} turns did not succeed, first: {failed[0]}")
    return window.result(in_flight, server1 - server0, client1 - client0)


async def daemon_round(
    *, workers: int, levels: Sequence[int], warm_s: float, seconds: float
) -> list[LevelResult]:
    """Start the daemon, measure every level, stop it."""
    async with daemon_stack(workers) as (stack, sid, pids):
        return [
            await daemon_level(stack, sid, pids, in_flight=n, warm_s=warm_s, seconds=seconds)
            for n in levels
        ]


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


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
    server0, client0 = cpu_seconds(pids), _own_cpu()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server1, client1 = cpu_seconds(pids), _own_cpu()
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
