"""``<root>/state/daemon.lock``: an exclusive ``flock`` holding the daemon's pid, so that a
second daemon on the same root is refused with the first one's pid (`DaemonAlreadyRunning`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from supervisor.errors import DaemonAlreadyRunning

__all__ = ["root_lock"]


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[Path]:
    """Hold the root's lock until the block ends (raises `DaemonAlreadyRunning`)."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    path = state / "daemon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise DaemonAlreadyRunning(root, int(text) if text.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
