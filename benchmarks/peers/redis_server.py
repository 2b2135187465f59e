"""A private ``redis-server`` on loopback, on a free port, with its data in a temp dir."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

DURABLE_SETTINGS = "appendonly yes\nappendfsync always\n"
"""Every write is in the append-only file and fsynced before Redis answers."""


@dataclass(frozen=True, slots=True)
class RedisServer:
    """A running server: its URL, pid and data directory."""

    url: str
    pid: int
    directory: Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(*, durable: bool, start_timeout_s: float = 10.0) -> Iterator[RedisServer]:
    """Start ``redis-server`` (durable: AOF with ``appendfsync always``; otherwise Redis's own
    defaults: RDB snapshots only, no AOF); stop it and remove its data when the block ends."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    directory = Path(tempfile.mkdtemp(prefix="hh-compare-redis-"))
    port = free_port()
    config = directory / "redis.conf"
    config.write_text(
        f"bind 127.0.0.1\nport {port}\nprotected-mode yes\ndir {directory}\n"
        f"logfile {directory / 'redis.log'}\ndaemonize no\n" + (DURABLE_SETTINGS if durable else "")
    )
    process = subprocess.Popen(
        [binary, str(config)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.02)  # polling a child's startup
        if durable:
            appendfsync = client.config_get("appendfsync")["appendfsync"]
            if appendfsync != "always":
                raise RuntimeError(f"redis-server runs with appendfsync {appendfsync}")
        client.close()
        yield RedisServer(url=f"redis://127.0.0.1:{port}/0", pid=process.pid, directory=directory)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
