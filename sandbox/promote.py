"""Promotion: move a turn's declared outputs into the session workspace, all or nothing.

Called only after the realized writes matched the declaration exactly and every process of
the turn is gone. Each file is opened with ``O_NOFOLLOW`` and must still be the inode that
was enumerated and hashed (``dev``/``ino``, one link). Every output is first staged beside
its destination (renamed there on the same filesystem; otherwise copied to a temporary file,
hashed while copying -- the hash must equal the enumerated one -- and ``fsync``-ed); only when
all are staged are they renamed into place. Any failure (a changed file, ENOSPC) rolls back:
the workspace is left as it was. The
promoted file belongs to the supervisor (not the turn's uid) and loses set-id bits.
Destination directories are created as needed; a destination path whose resolved parent
leaves the workspace is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox.enumerate import RealizedWrite

__all__ = ["PromotedOutput", "PromotionError", "StagedOutputs", "promote_outputs", "stage_outputs"]


class PromotionError(OSError):
    """Raised when an output cannot be promoted (changed since enumeration, bad target)."""


@dataclass(frozen=True, slots=True)
class PromotedOutput:
    """One promoted file: the declared path, its final location, sha256 and size."""

    path: str
    destination: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, object]:
        """As recorded in evidence."""
        return {
            "path": self.path,
            "destination": self.destination,
            "sha256": self.sha256,
            "size": self.size,
        }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_fd(src: int, dst: int) -> str:
    """Copy *src* to *dst* (both fds); return the sha256 of what was copied."""
    digest = hashlib.sha256()
    while chunk := os.read(src, 1 << 20):
        digest.update(chunk)
        view = memoryview(chunk)
        while view:  # a short write (a nearly full disk) is not the end: ENOSPC comes next
            view = view[os.write(dst, view) :]
    return digest.hexdigest()


def _copy_checked(src: int, out: int, write: RealizedWrite) -> None:
    """Copy *src* into *out* (closed here), fsync it, and check the enumerated hash."""
    try:
        digest = _copy_fd(src, out)
        os.fsync(out)
    finally:
        os.close(out)
    if digest != write.sha256:
        raise PromotionError(f"{write.path}: content changed since enumeration")


@dataclass(slots=True)
class _Staged:
    """One output made ready beside its destination, not yet in place."""

    write: RealizedWrite
    src: Path
    tmp: Path
    dest: Path
    moved: bool  # same filesystem: the source itself was renamed to ``tmp``
    backup: Path | None = None  # the destination's previous file while the commit runs
    placed: bool = False


def _temp_beside(dest: Path, tag: str) -> Path:
    return dest.parent / f".{dest.name}.hunter-{tag}-{secrets.token_hex(4)}"


def _make_parents(dest_parent: Path, workspace: Path, created: list[Path]) -> None:
    """Create the missing directories of *dest_parent* (recorded in *created*, outermost
    first, so that a failed promotion removes them again)."""
    missing = []
    for parent in (dest_parent, *dest_parent.parents):
        if parent == workspace or os.path.lexists(parent):
            break
        missing.append(parent)
    for directory in reversed(missing):
        directory.mkdir()
        created.append(directory)


def _open_source(src_dir: Path, write: RealizedWrite) -> int:
    """The enumerated file, opened without following a symlink; it must still be the inode
    that was enumerated, with one link."""
    fd = os.open(src_dir / write.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if (st.st_ino, st.st_dev) != (write.inode, write.device) or st.st_nlink != 1:
        os.close(fd)
        raise PromotionError(f"{write.path}: changed since it was enumerated")
    return fd


def _stage_one(
    src_dir: Path,
    fd: int,
    write: RealizedWrite,
    workspace: Path,
    created: list[Path],
    *,
    move: bool,
) -> _Staged:
    dest = workspace / write.path
    _make_parents(dest.parent, workspace, created)
    real_parent = Path(os.path.realpath(dest.parent))
    if real_parent != workspace and workspace not in real_parent.parents:
        raise PromotionError(f"{write.path}: destination leaves the workspace ({real_parent})")
    dest = real_parent / dest.name
    if os.path.isdir(dest) and not os.path.islink(dest):
        raise PromotionError(f"{write.path}: the destination is a directory")
    src = src_dir / write.path
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode) & 0o777 & ~0o022
    tmp = _temp_beside(dest, "new")
    if move and st.st_dev == os.stat(real_parent).st_dev:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.rename(src, tmp)
        staged = _Staged(write, src, tmp, dest, moved=True)
        if os.lstat(tmp).st_ino != st.st_ino:
            raise PromotionError(f"{write.path}: replaced during promotion")
        return staged
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        _copy_checked(fd, out, write)
    except BaseException:  # never leave the temporary copy beside the destination
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return _Staged(write, src, tmp, dest, moved=False)


def _commit(staged: list[_Staged]) -> None:
    """Rename every staged file into place (a previous file kept aside until all are in)."""
    for item in staged:
        if os.path.lexists(item.dest):
            item.backup = _temp_beside(item.dest, "old")
            os.rename(item.dest, item.backup)
        os.rename(item.tmp, item.dest)
        item.placed = True
    for parent in dict.fromkeys(item.dest.parent for item in staged):
        _fsync_dir(parent)
    for item in staged:
        if item.backup is not None:
            with contextlib.suppress(OSError):
                item.backup.unlink()


def _roll_back(staged: list[_Staged], created: list[Path]) -> None:
    """Undo a promotion that failed part of the way: the workspace is as it was."""
    for item in reversed(staged):
        with contextlib.suppress(OSError):
            if item.placed:
                os.rename(item.dest, item.tmp)
            if item.backup is not None:
                os.rename(item.backup, item.dest)
            if item.moved:
                os.rename(item.tmp, item.src)
            else:
                item.tmp.unlink()
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            directory.rmdir()


def promote_outputs(
    src_dir: Path,
    writes: Sequence[RealizedWrite],
    workspace: Path,
    *,
    done: list[PromotedOutput] | None = None,
    writer: tuple[int, int] | None = None,
) -> tuple[PromotedOutput, ...]:
    """Promote every realized write of ``src_dir`` (``output/<sid>``) into *workspace*, all or
    nothing.

    First every output is staged beside its destination (moved there on the same filesystem,
    otherwise copied, hash-checked and fsynced); only when all are staged are they renamed into
    place. A failure at any point (a changed file, a full disk) removes what was staged, puts
    back any file that was replaced and any directory created: the workspace is unchanged and
    the error is raised (`PromotionError` for a refused output, the ``OSError`` for I/O).
    The promoted files are appended to *done* once all of them are in place.

    *writer* ``(uid, gid)``: the sources are opened with this process's rights, everything in
    the workspace is done with that file-system identity (`sandbox.confine.fsid`; always a
    copy, the promoted files belong to *writer*). The sandbox helper promotes so for the
    unprivileged daemon. Call it in one thread (the identity is the thread's).
    """
    fds: list[int] = []
    try:
        for write in writes:
            fds.append(_open_source(src_dir, write))
        if writer is None:
            return _promote(src_dir, writes, fds, workspace, done=done, move=True)
        from sandbox.confine.fsid import fs_identity  # here: ctypes only where it is used

        with fs_identity(*writer):
            return _promote(src_dir, writes, fds, workspace, done=done, move=False)
    finally:
        for fd in fds:
            os.close(fd)


def _promote(
    src_dir: Path,
    writes: Sequence[RealizedWrite],
    fds: Sequence[int],
    workspace: Path,
    *,
    done: list[PromotedOutput] | None,
    move: bool,
) -> tuple[PromotedOutput, ...]:
    ws = Path(os.path.realpath(workspace))
    ws.mkdir(parents=True, exist_ok=True)
    staged: list[_Staged] = []
    created: list[Path] = []
    try:
        for write, fd in zip(writes, fds, strict=True):
            staged.append(_stage_one(src_dir, fd, write, ws, created, move=move))
        _commit(staged)
    except BaseException:
        _roll_back(staged, created)
        raise
    promoted = [
        PromotedOutput(s.write.path, str(s.dest), s.write.sha256, s.write.size) for s in staged
    ]
    if done is not None:
        done.extend(promoted)
    return tuple(promoted)


class StagedOutputs:
    """Outputs staged beside their destinations (`stage_outputs`), not yet in place: the
    caller records the turn first, then `place`s them, or `discard`s them when it could not
    (the workspace is then as it was). Each method runs in one thread (a worker's)."""

    def __init__(self, staged: list[_Staged], created: list[Path]) -> None:
        self._staged = staged
        self._created = created
        #: what `place` puts into the workspace (as recorded before it does)
        self.outputs = tuple(
            PromotedOutput(s.write.path, str(s.dest), s.write.sha256, s.write.size) for s in staged
        )

    @property
    def empty(self) -> bool:
        """Nothing was staged: placing and discarding have nothing to do."""
        return not self._staged and not self._created

    def place(self) -> tuple[PromotedOutput, ...]:
        """Rename every staged output into place (all or nothing, as `promote_outputs`)."""
        try:
            _commit(self._staged)
        except BaseException:
            _roll_back(self._staged, self._created)
            raise
        return self.outputs

    def discard(self) -> None:
        """Take the staged outputs away again: the workspace is as it was."""
        _roll_back(self._staged, self._created)


def stage_outputs(src_dir: Path, writes: Sequence[RealizedWrite], workspace: Path) -> StagedOutputs:
    """The first half of `promote_outputs` (this process's own identity, sources moved when on
    the same filesystem): every output checked and staged beside its destination, nothing in
    place yet. Raises as `promote_outputs` does, with nothing left staged."""
    fds: list[int] = []
    staged: list[_Staged] = []
    created: list[Path] = []
    ws = Path(os.path.realpath(workspace))
    try:
        for write in writes:
            fds.append(_open_source(src_dir, write))
        ws.mkdir(parents=True, exist_ok=True)
        for write, fd in zip(writes, fds, strict=True):
            staged.append(_stage_one(src_dir, fd, write, ws, created, move=True))
    except BaseException:
        _roll_back(staged, created)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return StagedOutputs(staged, created)
