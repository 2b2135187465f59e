"""The one way the benchmarks start a daemon: a real ``hunter serve`` on a fresh root, its
executors, a session; stopped cleanly afterwards.

``running_daemon`` (an async context manager) prepares a fresh root (``prepare_root``: the demo
package, the given config; the embedded SQLite store, or PostgreSQL when a *dsn* is given),
starts the daemon (``DemoStack.start_daemon``: READY=1 on a private NOTIFY_SOCKET), spawns one
executor process per group of ids (by default ``bench_executors.py``'s no-op SDK executors),
waits until every executor is connected, opens a session of the demo package and yields a
`BenchDaemon`: the stack, the session, the daemon's `psutil.Process` for its CPU and RSS, and the
executor processes. On the way out the executors are killed, the daemon drained (SIGTERM) and
the directory it created removed.

Beside it, the helpers several benchmarks share: `percentile`, `cpu_seconds` / `own_cpu`,
`pipelined` (lanes of ``turn.submit`` over a few control connections), and for the PostgreSQL
rows `pg_cluster`, `fresh_database` and `pg_server_pids`.

``benchmarks/`` is not an installed package: a benchmark run as a script puts the repository
on ``sys.path`` before importing ``benchmarks.harness``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
import psutil

from benchmarks import bench_executors
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root

if TYPE_CHECKING:
    from tests.supervisor.store.pg_cluster import PgCluster

REPO = Path(__file__).resolve().parent.parent

#: the daemon's configuration for throughput runs: a deep queue, quiet heartbeats, and logging
#: at "warning" (at "info" it writes ~6 JSON lines per turn)
BENCH_CONFIG = """\
drain_grace_s = 5.0
[executors]
queue_capacity = 100000
heartbeat_interval_s = 5.0
[log]
format = "json"
level = "warning"
"""

#: starts the executor processes for one group of ids on the daemon's executor socket
Spawn = Callable[[Path, Sequence[str]], Awaitable[anyio.abc.Process]]


def noop(slots: int) -> Spawn:
    """``bench_executors.py``'s no-op SDK executors (a READ answers success at once), *slots*
    slots each, all the group's ids in one process."""

    async def spawn(socket: Path, ids: Sequence[str]) -> anyio.abc.Process:
        return await bench_executors.spawn(
            "--role", "noop", "--socket", str(socket), "--ids", ",".join(ids),
            "--slots", str(slots),
        )  # fmt: skip

    return spawn


@dataclass
class BenchDaemon:
    """A running daemon of `running_daemon`."""

    stack: DemoStack
    #: the daemon process (CPU and RSS figures)
    process: psutil.Process
    #: the session opened at the start ("" when none was asked for)
    sid: str = ""
    executors: list[anyio.abc.Process] = field(default_factory=list)

    @property
    def control_socket(self) -> Path:
        return self.stack.control_socket

    @property
    def executor_socket(self) -> Path:
        return self.stack.executor_socket

    @property
    def pids(self) -> list[int]:
        """The daemon's and its executor processes' pids (the server side's CPU)."""
        return [self.process.pid, *(e.pid for e in self.executors)]

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        """One control call on a connection of its own."""
        async with ControlClient(self.control_socket) as client:
            return dict(await client.call(op, **params))

    async def open_session(self, **params: Any) -> str:
        """A new session of the demo package (``tenant=`` etc. go to ``session.open``)."""
        return str((await self.call("session.open", package_id="demo", **params))["session_id"])

    async def add_executors(
        self, groups: Sequence[Sequence[str]], spawn: Spawn, *, timeout_s: float = 30.0
    ) -> None:
        """One process per group of executor ids, then wait until every id is connected."""
        for ids in groups:
            self.executors.append(await spawn(self.executor_socket, ids))
        async with ControlClient(self.control_socket) as client:
            for executor_id in [i for ids in groups for i in ids]:
                await client.call("executors.wait", executor_id=executor_id, timeout_s=timeout_s)

    def rss_mb(self) -> float:
        rss: int = self.process.memory_info().rss
        return rss / 1e6

    def cpu_s(self) -> float:
        """The daemon process's user + system CPU seconds so far."""
        times = self.process.cpu_times()
        return float(times.user + times.system)


@contextlib.asynccontextmanager
async def running_daemon(
    *,
    config: str = BENCH_CONFIG,
    dsn: str | None = None,
    executors: Sequence[Sequence[str]] = (),
    spawn: Spawn | None = None,
    session: bool = True,
    env: Mapping[str, str] | None = None,
    base: Path | None = None,
    name: str = "root",
    prefix: str = "hh-bench-",
    timeout_s: float = 30.0,
) -> AsyncIterator[BenchDaemon]:
    """A daemon on the fresh root ``base/name`` with *config* (plus a ``[store]`` section for
    PostgreSQL when *dsn* is given) and environment *env*; one executor process per group in
    *executors*, started by *spawn* (default: no-op executors of 8 slots), all connected within
    *timeout_s*; a session when *session*. Without *base* a temporary directory (*prefix*,
    mode 0711) is made and removed afterwards."""
    own = base is None
    directory = Path(tempfile.mkdtemp(prefix=prefix)) if base is None else base
    if own:
        os.chmod(directory, 0o711)  # process turns would run as another uid: keep it traversable
    root = directory / name
    store = "" if dsn is None else f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\n'
    stack: DemoStack | None = None
    daemon: BenchDaemon | None = None
    try:
        config_path = prepare_root(root, fresh=True, config_text=config + store)
        stack = DemoStack(root=root, config_path=config_path, env=dict(env or {}))
        process = await stack.start_daemon()
        daemon = BenchDaemon(stack=stack, process=psutil.Process(process.pid))
        await daemon.add_executors(executors, spawn or noop(8), timeout_s=timeout_s)
        if session:
            daemon.sid = await daemon.open_session()
        yield daemon
    finally:
        with anyio.CancelScope(shield=True):
            for child in daemon.executors if daemon is not None else []:
                if child.returncode is None:
                    child.kill()
                await child.wait()
                await child.aclose()
            if stack is not None:
                await stack.aclose()
            if own:
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))


# --------------------------------------------------------------------------- shared helpers


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


def own_cpu() -> float:
    """This process's user + system CPU seconds (the benchmark's client side)."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


async def pipelined(
    socket: Path,
    connections: int,
    lanes: int,
    lane: Callable[[ControlClient], Coroutine[Any, Any, None]],
) -> float:
    """*connections* control connections with *lanes* concurrent ``lane(conn)`` tasks each (each
    lane its own closed loop of calls); the seconds until every lane returned."""

    async def connection() -> None:
        async with ControlClient(socket) as conn, anyio.create_task_group() as tg:
            for _ in range(lanes):
                tg.start_soon(lane, conn)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(connections):
            tg.start_soon(connection)
    return time.perf_counter() - start


# --------------------------------------------------------------------------- PostgreSQL


@contextlib.asynccontextmanager
async def pg_cluster() -> AsyncIterator[PgCluster]:
    """A private PostgreSQL cluster (``tests/supervisor/store/pg_cluster.py``), stopped and
    removed afterwards."""
    from tests.supervisor.store.pg_cluster import start_cluster, stop_cluster

    started = await anyio.to_thread.run_sync(start_cluster)
    try:
        yield started
    finally:
        await anyio.to_thread.run_sync(stop_cluster, started)


def pg_server_pids(pg: PgCluster) -> list[int]:
    """The postmaster's pid (its backends are its children: `cpu_seconds` counts them)."""
    return [int((pg.data / "postmaster.pid").read_text().split()[0])]


async def fresh_database(pg: PgCluster, name: str, *, migrate: bool = True) -> str:
    """An empty database *name* on *pg* (dropped first if it exists), with the daemon's schema
    when *migrate*; its DSN."""
    import asyncpg

    from supervisor.store.postgres import migrate_database

    conn = await asyncpg.connect(pg.dsn())
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    dsn = pg.dsn(name)
    if migrate:
        await migrate_database(dsn)
    return dsn
