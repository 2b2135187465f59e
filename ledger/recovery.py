"""Opening a ledger file for writing, whatever its last writer left: a clean close or a crash.

A crashed writer may have left a torn last line (bytes after the last newline) and lines that
reached the page cache only. `recover_file` verifies every complete line and the anchored head
first, so a file that fails (e.g. an anchored entry lost its newline) is refused untouched; only
then is the torn tail moved aside to ``<file>.broken`` and truncated away, the remaining content
made durable and its head anchored. The writer continues the chain from what it returns.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from ledger.chain import genesis_hash
from ledger.clock import wall_clock_us
from ledger.files import fsync_dir
from ledger.heads import Head, HeadAnchor, HeadStore, read_head, resolve_head_path
from ledger.verify import scan_bytes

__all__ = ["RecoveredFile", "move_torn_tail", "recover_file"]

_log = structlog.get_logger("ledger")


@dataclass(frozen=True, slots=True)
class RecoveredFile:
    """A ledger file opened for appending, verified, durable and anchored (its writer owns the
    descriptor and the anchor from here on)."""

    #: the ``O_APPEND`` descriptor of the ledger file
    fd: int
    #: ``st_dev`` of the file
    device: int
    #: ``seq`` and ``entry_hash`` of the last entry (0 and the genesis hash when there is none)
    head_seq: int
    head_hash: str
    #: the last entry's ``ts_us`` (later entries never go below it)
    last_ts_us: int
    #: hash-less lines at the start of the file
    legacy_entries: int
    #: the head file and its open anchor, holding the recovered head (synced)
    head_path: Path
    anchor: HeadAnchor
    #: ``time.monotonic()`` when the anchor was last synced
    anchored_at: float


def move_torn_tail(path: Path, fd: int, data: bytes) -> bytes:
    """Move bytes after the last newline to ``<file>.broken``; truncate; return what remains."""
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    broken = path.with_name(path.name + ".broken")
    created = not broken.exists()
    header = (
        f"# torn tail of {path.name}: offset {cut}, {len(tail)} bytes, "
        f"file size {len(data)}, moved at ts_us {wall_clock_us()}\n"
    ).encode("ascii")
    broken_fd = os.open(broken, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(broken_fd, header + tail + b"\n")
        os.fsync(broken_fd)
    finally:
        os.close(broken_fd)
    if created:
        fsync_dir(path.parent)
    os.ftruncate(fd, cut)
    os.fsync(fd)
    _log.warning(
        "ledger_torn_tail_moved",
        path=str(path),
        offset=cut,
        bytes=len(tail),
        broken=str(broken),
    )
    return data[:cut]


def recover_file(
    path: Path, *, ledger_id: str, head_store: HeadStore | Path | None
) -> RecoveredFile:
    """Open (creating if needed) the ledger *path* as its writer finds it after a crash.

    Raises `IntegrityError` if its content or anchored head fails verification; the caller holds
    the writer lock. On any error nothing stays open.
    """
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    anchor: HeadAnchor | None = None
    try:
        if created:
            fsync_dir(path.parent)
        device = os.fstat(fd).st_dev
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
        head_path = resolve_head_path(path, head_store)
        anchored = read_head(head_path)
        complete = data[: data.rfind(b"\n") + 1]
        # Verify everything before the torn tail first: a file that fails (e.g. an anchored
        # entry lost its newline) is refused untouched; only then is the tail moved aside.
        scan = scan_bytes(complete, path, ledger_id=ledger_id, anchor=anchored)
        if len(complete) < len(data):
            data = move_torn_tail(path, fd, data)
        seq = scan.head_seq
        digest = scan.head_hash if scan.entries else genesis_hash(ledger_id, scan.legacy_prefix)
        if data:
            os.fdatasync(fd)  # a crashed writer's lines may be in the page cache only
        anchor = HeadAnchor(head_path)
        anchor.write(Head(seq, digest))  # the recovered content is durable
        anchor.sync()
        anchored_at = time.monotonic()
    except BaseException:
        try:
            if anchor is not None:
                anchor.close()
        finally:
            os.close(fd)
        raise
    return RecoveredFile(
        fd=fd,
        device=device,
        head_seq=seq,
        head_hash=digest,
        last_ts_us=scan.last_ts_us,
        legacy_entries=scan.legacy_entries,
        head_path=head_path,
        anchor=anchor,
        anchored_at=anchored_at,
    )
