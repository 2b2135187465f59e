"""The nemesis's PostgreSQL: the tests' private cluster, also listening on TCP.

`tests.supervisor.store.pg_cluster.start_cluster` makes a cluster with no TCP at all (its Unix
socket in its own directory). The daemons of a nemesis run reach the server through a TCP proxy
each (`tests.storms.proxy`), so here the same cluster is reconfigured to listen on 127.0.0.1 on a
private port as well (``ALTER SYSTEM``, then a restart), and `restart` is the nemesis's server
restart (``pg_ctl restart -m fast``). Nothing of ``pg_cluster.py`` is changed: its `PgCluster`
is replaced by a copy naming the new port, and ``psql`` and `stop` keep working with it.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.supervisor.store.pg_cluster import PgCluster, PgClusterError, start_cluster, stop_cluster

__all__ = ["TcpCluster", "free_port", "start_tcp_cluster"]

_PG_CTL_TIMEOUT_S = 60


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pg_ctl(cluster: PgCluster, *args: str) -> None:
    """Run ``pg_ctl -D DATA ARGS`` as the server's OS user; raises `PgClusterError`."""
    uid = gid = None
    if cluster.run_as is not None:
        entry = pwd.getpwnam(cluster.run_as)
        uid, gid = entry.pw_uid, entry.pw_gid
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    argv = [str(cluster.bin_dir / "pg_ctl"), "-D", str(cluster.data), *args]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd="/",
            env=env,
            timeout=_PG_CTL_TIMEOUT_S,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PgClusterError(f"pg_ctl {' '.join(args)} failed: {exc}") from exc
    if done.returncode != 0:
        raise PgClusterError(
            f"pg_ctl {' '.join(args)} exited {done.returncode}: "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )


@dataclass(frozen=True, slots=True)
class TcpCluster:
    """A private cluster listening on ``127.0.0.1:port`` and on its Unix socket."""

    pg: PgCluster

    @property
    def port(self) -> int:
        return self.pg.port

    @property
    def server_log(self) -> Path:
        """The server's log (``pg_ctl -l``): errors, deadlocks, restarts."""
        return self.pg.root / "server.log"

    def create_database(self, name: str) -> None:
        self.pg.psql(f"CREATE DATABASE {name}")

    def tcp_dsn(self, database: str, *, port: int | None = None) -> str:
        """A DSN of *database* as the superuser over TCP, on *port* (a proxy's) or the
        server's own."""
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection cut, the server back when it returns."""
        _pg_ctl(self.pg, "-l", str(self.server_log), "-m", "fast", "-w", "-t", "40", "restart")

    def stop(self) -> None:
        """Stop the server and remove its files (`pg_cluster.stop_cluster`)."""
        stop_cluster(self.pg)


def start_tcp_cluster() -> TcpCluster:
    """`pg_cluster.start_cluster`, then listening on 127.0.0.1 on a free port too (a restart);
    the log records lock waits and every connection's errors (deadlocks among them)."""
    plain = start_cluster()
    try:
        port = free_port()
        for setting, value in (
            ("listen_addresses", "'127.0.0.1'"),
            ("port", str(port)),
            ("log_lock_waits", "on"),
            ("deadlock_timeout", "'200ms'"),
            ("log_line_prefix", "'%m [%p] %a '"),
        ):
            plain.psql(f"ALTER SYSTEM SET {setting} = {value}")
        cluster = TcpCluster(dataclasses.replace(plain, port=port))
        cluster.restart()
    except BaseException:
        stop_cluster(plain)
        raise
    return cluster
