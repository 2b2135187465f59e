"""Directory durability: create directories and make new names durable (fsync the parent)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "make_dirs"]


def fsync_dir(path: Path) -> None:
    """fsync a directory so names created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """``mkdir -p`` that fsyncs the parent of every directory it creates."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        fsync_dir(directory.parent)
