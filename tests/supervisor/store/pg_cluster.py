"""A private PostgreSQL cluster for the tests and benchmarks, started and stopped by them.

``initdb`` + ``pg_ctl start`` into a fresh temporary directory: no TCP at all
(``listen_addresses = ''``), the Unix socket in that directory, trust for the local superuser
``postgres``, and the durability settings at their defaults (``fsync``, ``synchronous_commit``,
``full_page_writes`` all on: durability is what the store promises). The server binaries come
from PATH or from Debian's ``/usr/lib/postgresql/<version>/bin`` (``scripts/setup-system``
installs the ``postgresql`` package). ``initdb`` refuses to run as root, so as root the cluster
runs as the ``postgres`` OS user (the package creates it), else as ``nobody``; the directory is
created directly under the system temporary directory so that user can reach it.

`shared_cluster` starts one cluster per test session on first use (the SQLite-only runs never
pay for it); the session fixture in ``conftest.py`` stops it at the end. `database_for` gives
each test (keyed by its temporary directory) a database of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "PgCluster",
    "PgClusterError",
    "database_for",
    "find_bin_dir",
    "shared_cluster",
    "start_cluster",
    "stop_cluster",
    "stop_shared_cluster",
]

#: the socket file is ``.s.PGSQL.<port>`` in the cluster's own directory: no port clash possible
PORT = 5432
_START_TIMEOUT_S = 40


class PgClusterError(RuntimeError):
    """Raised when the private cluster cannot be found, created, started or queried; the
    message carries the failing command's output."""


@dataclass(frozen=True, slots=True)
class PgCluster:
    root: Path
    data: Path
    socket_dir: Path
    port: int
    bin_dir: Path
    #: the OS user the server runs as (None: the current user)
    run_as: str | None

    def dsn(self, database: str = "postgres") -> str:
        """A libpq/asyncpg URI for *database* as the superuser, over the Unix socket."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://postgres@/{database}?host={host}&port={self.port}"

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run *sql* with ``psql`` (stops at the first error); its output."""
        return _run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                sql,
            ],
            user=None,
        )


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.parent.name)) or (0,)


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH first, then Debian's layout
    (the newest version)."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version_key)
    if not candidates:
        raise PgClusterError(
            "PostgreSQL server binaries not found (no initdb on PATH or under"
            " /usr/lib/postgresql/*/bin); install Debian's postgresql package"
            " (bash scripts/setup-system does)"
        )
    return candidates[-1].parent


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PgClusterError("running as root and neither a postgres nor a nobody user exists")


def _run(argv: list[str], *, user: str | None, timeout: float = 60) -> str:
    uid = gid = None
    if user is not None:
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    try:
        done = subprocess.run(  # noqa: PLW1510 (the code is checked below, with the output)
            argv,
            capture_output=True,
            text=True,
            cwd="/",
            env=env,
            timeout=timeout,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PgClusterError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise PgClusterError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout}"
        )
    return str(done.stdout)


def start_cluster() -> PgCluster:
    """A new cluster in a new temporary directory, running and accepting connections."""
    bin_dir = find_bin_dir()
    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="hunter-pg-"))
    data, socket_dir = root / "data", root / "sock"
    socket_dir.mkdir()
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (root, socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    cluster = PgCluster(
        root=root, data=data, socket_dir=socket_dir, port=PORT, bin_dir=bin_dir, run_as=user
    )
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",  # the empty cluster; fsync stays on for everything after
            ],
            user=user,
        )
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{socket_dir}'",
            "port": str(PORT),
            "shared_buffers": "'32MB'",
            "max_connections": "100",
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "log_min_messages": "warning",
        }
        with (data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "start",
            ],
            user=user,
            timeout=_START_TIMEOUT_S + 10,
        )
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: PgCluster) -> None:
    """Stop the server and remove its files. Immediate shutdown: no final checkpoint (seconds
    of fsync for a cluster whose files are deleted next); SIGKILL by pid if it lingers."""
    pid_file = cluster.data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(PgClusterError):
            _run(
                [
                    str(cluster.bin_dir / "pg_ctl"),
                    *("-D", str(cluster.data), "-m", "immediate", "-w", "-t", "30", "stop"),
                ],
                user=cluster.run_as,
                timeout=40,
            )
        _kill_leftover(pid_file)
    shutil.rmtree(cluster.root, ignore_errors=True)


def _kill_leftover(pid_file: Path) -> None:
    try:
        first, second = pid_file.read_text().splitlines()[:2]
    except (OSError, ValueError):
        return
    # Only the postmaster of this data directory (the file's second line names it).
    if Path(second) != pid_file.parent:
        return
    with contextlib.suppress(ProcessLookupError, ValueError):
        os.kill(int(first), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and Path(f"/proc/{int(first)}").exists():
            time.sleep(0.05)


# -- one cluster per test session ---------------------------------------------------------------

_shared: list[PgCluster] = []
_databases: dict[str, str] = {}
_numbers = itertools.count(1)


def shared_cluster() -> PgCluster:
    """The session's cluster, started on first use."""
    if not _shared:
        _shared.append(start_cluster())
    return _shared[0]


def stop_shared_cluster() -> None:
    """Stop the session's cluster if it was started (the session fixture calls this)."""
    while _shared:
        stop_cluster(_shared.pop())
    _databases.clear()


def database_for(key: Path | str) -> str:
    """A DSN of a database of its own for *key* (a test's temporary directory): created on
    the first call, the same database on every later call with the same key."""
    name = _databases.get(str(key))
    if name is None:
        name = f"t{os.getpid()}_{next(_numbers)}"
        shared_cluster().psql(f"CREATE DATABASE {name}")
        _databases[str(key)] = name
    return shared_cluster().dsn(name)


def crash_and_restart(cluster: PgCluster, *, down_s: float = 0.0) -> None:
    """Stop the server as a crash would (``-m immediate``: no checkpoint, every connection
    cut), wait *down_s*, start it again (crash recovery replays the WAL)."""
    _run(
        [str(cluster.bin_dir / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "-w", "stop"],
        user=cluster.run_as,
        timeout=40,
    )
    time.sleep(down_s)
    _run(
        [
            str(cluster.bin_dir / "pg_ctl"),
            *("-D", str(cluster.data), "-l", str(cluster.root / "server.log")),
            *("-w", "-t", str(_START_TIMEOUT_S), "start"),
        ],
        user=cluster.run_as,
        timeout=_START_TIMEOUT_S + 10,
    )
