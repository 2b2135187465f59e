"""The metrics as a node-exporter textfile, rewritten atomically every few seconds.

node-exporter's textfile collector reads every ``*.prom`` file of its directory at each scrape;
a half-written file would be read as garbage, so each version is written to a temporary file in
the same directory and renamed over the old one (``rename`` is atomic within a file system).
The text is rendered on the event loop; only the file I/O runs on a worker thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from supervisor.logging import get_logger

__all__ = ["write_textfile", "write_textfiles"]


def write_textfile(path: Path, data: bytes) -> None:
    """Replace *path* with *data* atomically (readers see the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


async def write_textfiles(
    path: Path,
    render: Callable[[], bytes],
    *,
    interval_s: float,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Write *path* now, then every *interval_s* seconds, until cancelled. A failed write is
    logged (``metrics_textfile_failed``) and tried again at the next interval: metrics never
    stop the daemon."""
    log = get_logger("supervisor.metrics")
    failing = False
    started = False
    while True:
        try:
            await anyio.to_thread.run_sync(write_textfile, path, render())
        except OSError as exc:
            if not failing:  # once per failure streak, not every interval
                log.warning("metrics_textfile_failed", path=str(path), error=str(exc))
            failing = True
        else:
            failing = False
        if not started:
            started = True
            task_status.started()
        await anyio.sleep(interval_s)
