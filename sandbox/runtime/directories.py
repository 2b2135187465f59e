"""Emptying and removing the directories a session's turns write in, never following a link.

Apart from `area` (which empties ``tmp/<sid>`` and ``output/<sid>`` after each turn) because the
confined run (`attempt`) and the start-up reclaim (`leftovers`) use them too, and neither may
import the area.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

__all__ = ["all_empty", "empty_directory", "remove_directory"]


_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlink_non_directories(dir_fd: int) -> tuple[list[str], int]:
    """Unlink every entry of *dir_fd* that is not a directory; return the directories and
    the bytes unlinked (the sizes of the regular files)."""
    with os.scandir(dir_fd) as entries:
        listed = [
            (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
            for e in entries
        ]
    subdirs: list[str] = []
    size = 0
    for name, is_dir, is_file in listed:
        if is_dir:
            subdirs.append(name)
            continue
        if is_file:
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
        os.unlink(name, dir_fd=dir_fd)
    return subdirs, size


def empty_directory(path: Path) -> int:
    """Remove everything inside *path* (kept itself), never following a symlink; return the
    bytes removed (the sizes of the regular files unlinked).

    Iterative (``shutil.rmtree`` recurses in Python and fails on the thousands of nested
    directories a turn can leave, which would stop every later attempt of the session);
    one directory fd stays open per level of the current path.
    """
    stack: list[tuple[int, list[str]]] = []
    removed = 0
    top = os.open(path, _DIR_FLAGS)
    try:
        subdirs, size = _unlink_non_directories(top)
        stack.append((top, subdirs))
        removed += size
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            dir_fd, subdirs = stack[-1]
            if subdirs:
                child = os.open(subdirs[-1], _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    grandchildren, size = _unlink_non_directories(child)
                    stack.append((child, grandchildren))
                    removed += size
                except BaseException:
                    os.close(child)
                    raise
                continue
            stack.pop()
            os.close(dir_fd)
            if stack:
                parent_fd, siblings = stack[-1]
                os.rmdir(siblings.pop(), dir_fd=parent_fd)
    finally:
        for dir_fd, _subdirs in stack:
            os.close(dir_fd)
    return removed


def remove_directory(path: Path) -> int:
    """Remove *path* and everything in it, never following a symlink (a symlink or other
    non-directory at *path* is unlinked itself); return the bytes removed. Nothing there
    is not an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return 0
    removed = empty_directory(path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)
    return removed


def all_empty(directories: Iterable[Path]) -> bool:
    for directory in directories:
        try:
            with os.scandir(directory) as entries:
                if next(entries, None) is not None:
                    return False
        except FileNotFoundError:
            continue
    return True
