"""The writer lock of a ledger file: ``flock`` on ``<file>.lock``, which records the holder's pid.

One writer per file: a second one is refused with `LedgerLockedError` naming the holder. Closing
the descriptor releases the lock, so a crashed writer's lock goes with its process.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ledger.errors import LedgerLockedError

__all__ = ["acquire_lock", "read_lock_pid"]


def read_lock_pid(fd: int) -> int | None:
    """The pid the lock file records (None when it records none)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def acquire_lock(path: Path) -> int:
    """Take the writer lock of the ledger *path*; return the lock file's descriptor (close it to
    release the lock). Raises `LedgerLockedError` if another writer holds it."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = read_lock_pid(fd)
        os.close(fd)
        raise LedgerLockedError(path, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd
