"""Realized writes: walk the session sandbox without following symlinks (FR-RT-015).

For each area (``output`` = ``output/<sid>``, ``tmp`` = ``tmp/<sid>``) the walk uses directory
fds only (``openat`` relative to the parent dir's fd, ``O_NOFOLLOW``), so a symlink swapped in
for a directory or file is never followed. Each regular file is opened with
``O_NOFOLLOW | O_NONBLOCK`` and ``fstat``-ed; its inode must be the one ``readdir`` listed
(a swap between listing and opening is reported as ``swapped``), and it is hashed from that
fd. Symlinks, hard links (``st_nlink > 1``), device nodes, FIFOs and sockets are *problems*
(capability violations for the turn); they are never opened.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["RealizedWrite", "SurfaceProblem", "WriteSurface", "enumerate_writes"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class RealizedWrite:
    """One regular file the turn left behind: area, path relative to the area, sha256, size."""

    area: str
    path: str
    sha256: str
    size: int
    inode: int = 0
    device: int = 0

    def to_dict(self) -> dict[str, object]:
        """As recorded in evidence."""
        return {"area": self.area, "path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, slots=True)
class SurfaceProblem:
    """Something in the sandbox that is not a plain file: a write-surface violation."""

    area: str
    path: str
    kind: str  # symlink | hardlink | device | fifo | socket | swapped | unreadable | other

    def to_dict(self) -> dict[str, str]:
        """As recorded in evidence."""
        return {"area": self.area, "path": self.path, "kind": self.kind}


@dataclass(frozen=True, slots=True)
class WriteSurface:
    """Everything found in the sandbox after an attempt."""

    writes: tuple[RealizedWrite, ...]
    problems: tuple[SurfaceProblem, ...]

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all realized writes."""
        return sum(w.size for w in self.writes)

    def in_area(self, area: str) -> dict[str, RealizedWrite]:
        """Realized writes of one area by relative path."""
        return {w.path: w for w in self.writes if w.area == area}


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "other"


def _hash_fd(fd: int, size: int) -> str:
    digest = hashlib.sha256()
    want = size + 1 if size < _CHUNK else _CHUNK
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            break
        digest.update(chunk)
        if len(chunk) < want:
            break  # a short read on a regular file is the end of the file
        want = _CHUNK
    return digest.hexdigest()


_Listed = tuple[str, int, bool, bool]  # name, inode, is_dir, is_file (no symlink following)


def _list(dir_fd: int) -> list[_Listed]:
    with os.scandir(dir_fd) as entries:
        return [
            (e.name, e.inode(), e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
            for e in entries
        ]


def _open_subdir(dir_fd: int, name: str, inode: int) -> int | None:
    """The fd of directory *name* if it is still the listed inode (else None: swapped)."""
    try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    if os.fstat(sub).st_ino != inode:
        os.close(sub)
        return None
    return sub


def _visit_file(
    dir_fd: int,
    entry: _Listed,
    area: str,
    rel: str,
    *,
    writes: list[RealizedWrite],
    problems: list[SurfaceProblem],
) -> None:
    """Hash a listed regular file into *writes*; anything else is a problem."""
    name, inode, _is_dir, is_file = entry
    if not is_file:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            problems.append(SurfaceProblem(area, rel, "swapped"))
            return
        problems.append(SurfaceProblem(area, rel, _kind(mode)))
        return
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        problems.append(SurfaceProblem(area, rel, "swapped"))
        return
    try:
        st = os.fstat(fd)
        if st.st_ino != inode or not stat.S_ISREG(st.st_mode):
            problems.append(SurfaceProblem(area, rel, "swapped"))
            return
        if st.st_nlink > 1:
            problems.append(SurfaceProblem(area, rel, "hardlink"))
            return
        try:
            digest = _hash_fd(fd, st.st_size)
        except OSError:
            problems.append(SurfaceProblem(area, rel, "unreadable"))
            return
        writes.append(RealizedWrite(area, rel, digest, st.st_size, st.st_ino, st.st_dev))
    finally:
        os.close(fd)


def _walk(
    top_fd: int, area: str, writes: list[RealizedWrite], problems: list[SurfaceProblem]
) -> None:
    """Depth-first walk below *top_fd* (not closed here).

    Iterative, so a tree of any depth costs no Python recursion (a turn can nest thousands
    of directories); one directory fd stays open per level of the current path.
    """
    stack: list[tuple[int, str, Iterator[_Listed]]] = [(top_fd, "", iter(_list(top_fd)))]
    try:
        while stack:
            dir_fd, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if dir_fd != top_fd:
                    os.close(dir_fd)
                continue
            name, inode, is_dir, _is_file = entry
            rel = f"{prefix}{name}"
            if not is_dir:
                _visit_file(dir_fd, entry, area, rel, writes=writes, problems=problems)
                continue
            sub = _open_subdir(dir_fd, name, inode)
            if sub is None:
                problems.append(SurfaceProblem(area, rel, "swapped"))
                continue
            try:
                listed = _list(sub)
            except BaseException:
                os.close(sub)
                raise
            stack.append((sub, f"{rel}/", iter(listed)))
    finally:
        for dir_fd, _prefix, _entries in stack:
            if dir_fd != top_fd:
                os.close(dir_fd)


def enumerate_writes(areas: Mapping[str, Path]) -> WriteSurface:
    """Walk every area (name -> directory) and return its files and problems, sorted."""
    writes: list[RealizedWrite] = []
    problems: list[SurfaceProblem] = []
    for area, directory in areas.items():
        try:
            top = os.open(directory, _DIR_FLAGS)
        except FileNotFoundError:
            continue
        except OSError:
            problems.append(SurfaceProblem(area, ".", "swapped"))
            continue
        try:
            _walk(top, area, writes, problems)
        finally:
            os.close(top)
    writes.sort(key=lambda w: (w.area, w.path))
    problems.sort(key=lambda p: (p.area, p.path))
    return WriteSurface(tuple(writes), tuple(problems))
