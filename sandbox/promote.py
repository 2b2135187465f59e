"""Promotion: move a turn's declared outputs into the session workspace, atomically per file.

Called only after the realized writes matched the declaration exactly and every process of
the turn is gone. Each file is opened with ``O_NOFOLLOW`` and must still be the inode that
was enumerated and hashed (``dev``/``ino``, one link). On the same filesystem it is renamed
into place; otherwise it is copied to a temporary file beside the destination, hashed while
copying (the hash must equal the enumerated one), ``fsync``-ed and renamed into place. The
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

__all__ = ["PromotedOutput", "PromotionError", "promote_outputs"]


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
        os.write(dst, chunk)
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


def _promote_one(src_dir: Path, write: RealizedWrite, workspace: Path) -> PromotedOutput:
    dest = workspace / write.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    real_parent = Path(os.path.realpath(dest.parent))
    if real_parent != workspace and workspace not in real_parent.parents:
        raise PromotionError(f"{write.path}: destination leaves the workspace ({real_parent})")
    dest = real_parent / dest.name
    src = src_dir / write.path
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (write.inode, write.device) or st.st_nlink != 1:
            raise PromotionError(f"{write.path}: changed since it was enumerated")
        mode = stat.S_IMODE(st.st_mode) & 0o777 & ~0o022
        if st.st_dev == os.stat(real_parent).st_dev:
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, mode)
            os.fsync(fd)
            os.rename(src, dest)
            if os.lstat(dest).st_ino != st.st_ino:
                raise PromotionError(f"{write.path}: replaced during promotion")
        else:
            tmp = real_parent / f".{dest.name}.hunter-{secrets.token_hex(4)}"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            try:
                _copy_checked(fd, out, write)
                os.rename(tmp, dest)
            except BaseException:  # never leave the temporary copy beside the destination
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
    finally:
        os.close(fd)
    _fsync_dir(real_parent)
    return PromotedOutput(write.path, str(dest), write.sha256, write.size)


def promote_outputs(
    src_dir: Path,
    writes: Sequence[RealizedWrite],
    workspace: Path,
    *,
    done: list[PromotedOutput] | None = None,
) -> tuple[PromotedOutput, ...]:
    """Promote each realized write of ``src_dir`` (``output/<sid>``) into *workspace*.

    Each promoted file is also appended to *done* as soon as it is in place, so a caller
    still knows what reached the workspace when a later file fails.
    """
    ws = Path(os.path.realpath(workspace))
    ws.mkdir(parents=True, exist_ok=True)
    promoted = [] if done is None else done
    for write in writes:
        promoted.append(_promote_one(src_dir, write, ws))
    return tuple(promoted)
