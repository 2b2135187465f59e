"""Reading a session's workspace, bounded and never outside it (the filesystem MCP server's
rule: every path resolved, links followed, checked against the allowed root before use).

A path is relative to the workspace. It is refused when it is absolute, holds ``..`` or a NUL,
or resolves (links followed) outside the workspace. The file is then opened one component at a
time from the workspace's directory with ``O_NOFOLLOW``, so a link swapped in after the check
is refused too, and it must be a regular file. Blocking calls: run them in a worker thread.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from supervisor.mcp.errors import OutsideWorkspace

__all__ = ["FileEntry", "FileSlice", "list_files", "read_slice", "relative_path"]

#: a path argument's length at most (bytes)
MAX_PATH_BYTES: Final = 4_096
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class FileSlice:
    path: str
    size: int
    offset: int
    data: bytes

    @property
    def more(self) -> bool:
        return self.offset + len(self.data) < self.size


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int


def relative_path(text: str) -> PurePosixPath:
    """*text* as a path inside a workspace, checked without touching the disk."""
    if not text or "\x00" in text or len(text.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise OutsideWorkspace(
            f"path must be 1 to {MAX_PATH_BYTES} bytes without NUL, relative to the session's"
            " workspace (e.g. 'out.txt' or 'src/main.py')"
        )
    path = PurePosixPath(text)
    if path.is_absolute():
        raise OutsideWorkspace(
            f"path {text!r} is absolute: give it relative to the session's workspace"
            " (list_outputs shows what is there)"
        )
    if ".." in path.parts:
        raise OutsideWorkspace(
            f"path {text!r} climbs out with '..': give a path inside the session's workspace"
        )
    return path


def _inside(workspace: Path, path: PurePosixPath, shown: str) -> tuple[Path, PurePosixPath]:
    """The workspace's real path and *path* resolved (links followed) relative to it."""
    try:
        base = workspace.resolve(strict=True)
    except OSError:
        raise OutsideWorkspace(
            "the session's workspace does not exist yet: no turn has promoted an output"
        ) from None
    real = Path(os.path.realpath(base / path))
    if not real.is_relative_to(base):
        raise OutsideWorkspace(
            f"path {shown!r} leads out of the session's workspace (through a link): only files"
            " inside it can be read"
        )
    return base, PurePosixPath(real.relative_to(base).as_posix())


def _open_beneath(base: Path, rel: PurePosixPath, shown: str) -> int:
    """An fd of *rel* under *base*, no component a link (O_NOFOLLOW each step)."""
    parts = [p for p in rel.parts if p not in ("", ".")]
    if not parts:
        raise OutsideWorkspace(f"path {shown!r} is the workspace itself: name a file in it")
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def read_slice(workspace: Path, text: str, *, offset: int, limit: int) -> FileSlice:
    """Up to *limit* bytes of the workspace file *text* from *offset*."""
    base, rel = _inside(workspace, relative_path(text), text)
    try:
        fd = _open_beneath(base, rel, text)
    except FileNotFoundError:
        raise OutsideWorkspace(
            f"no file {text!r} in the session's workspace (list_outputs shows what is there)"
        ) from None
    except OSError as exc:
        raise OutsideWorkspace(
            f"path {text!r} cannot be opened inside the workspace: {exc.strerror}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OutsideWorkspace(f"path {text!r} is not a regular file")
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, limit) if limit > 0 else b""
    finally:
        os.close(fd)
    return FileSlice(path=rel.as_posix(), size=info.st_size, offset=offset, data=data)


def list_files(workspace: Path, *, limit: int) -> tuple[list[FileEntry], bool]:
    """The regular files under *workspace* (links not followed), by path, at most *limit*; and
    whether there were more."""
    try:
        base = workspace.resolve(strict=True)
    except OSError:
        return [], False
    found: list[FileEntry] = []
    for top, dirs, files in os.walk(base, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            full = Path(top) / name
            try:
                info = full.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if len(found) >= limit:
                return found, True
            found.append(FileEntry(path=full.relative_to(base).as_posix(), size=info.st_size))
    return found, False
