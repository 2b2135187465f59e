"""A session's disk: one size-limited tmpfs holding both ``tmp/<sid>`` and ``output/<sid>``.

``RLIMIT_FSIZE`` bounds each file and the post-run ``disk_mb`` check sees the total only after
the turn; the session disk is a hard bound while it runs. One tmpfs of ``disk_mb`` is mounted
at ``<root>/state/disks/<sid>`` (a place the turn cannot reach: ``state/**`` is forbidden) and
its ``tmp`` and ``output`` directories are bind-mounted onto ``tmp/<sid>`` and ``output/<sid>``,
so the two share one limit and a write past it fails with ENOSPC. The mounts are made by the
supervisor (root) in its own mount namespace (``nosuid,nodev``; exec stays governed by
Landlock) and detached when the session closes; `mounts_under` lets the start of a runtime
find and detach what a killed run left mounted.

tmpfs pages are charged to the memory cgroup of the process that writes them: a turn's files
count against its ``memory_mb`` as well, so a full disk may show as an OOM kill; both are
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from typing import Final

__all__ = ["mount_session_disk", "mounts_under", "unmount", "unmount_session_disk"]

_MS_NOSUID: Final = 0x2
_MS_NODEV: Final = 0x4
_MS_BIND: Final = 0x1000
_MNT_DETACH: Final = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        source.encode(),
        os.fsencode(target),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None if data is None else data.encode(),
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Detach the mount at *target* (lazily: it goes once nothing uses it)."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def mount_session_disk(
    disk: Path, areas: dict[str, Path], *, size_bytes: int, uid: int, gid: int
) -> None:
    """Mount a tmpfs of *size_bytes* at *disk* and bind its subdirectories named like the keys
    of *areas* onto the area directories (which must exist). Undone on failure."""
    disk.mkdir(mode=0o700, parents=True, exist_ok=True)
    _mount("tmpfs", disk, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size_bytes},mode=0700")
    done: list[Path] = [disk]
    try:
        for name, area in areas.items():
            sub = disk / name
            sub.mkdir(mode=0o700)
            if uid >= 0:
                os.chown(sub, uid, gid)
            _mount(str(sub), area, None, _MS_BIND, None)
            done.append(area)
    except BaseException:
        for target in reversed(done):
            with contextlib.suppress(OSError):
                unmount(target)
        raise


def unmount_session_disk(disk: Path, areas: dict[str, Path]) -> None:
    """Detach the area binds and the tmpfs (each one that is mounted) and remove *disk*."""
    for target in (*areas.values(), disk):
        if os.path.ismount(target):
            unmount(target)
    with contextlib.suppress(FileNotFoundError):
        disk.rmdir()


def _unescape(field: str) -> str:
    """Undo the octal escapes of /proc/self/mountinfo (``\\040`` is a space)."""
    if "\\" not in field:
        return field
    out = bytearray()
    i = 0
    raw = field.encode()
    while i < len(raw):
        if raw[i] == ord("\\") and i + 3 < len(raw) and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return os.fsdecode(bytes(out))


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or beneath *prefix* in this mount namespace, deepest first."""
    base = str(prefix).rstrip("/")
    found: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            fields = line.split(" ")
            if len(fields) < 5:
                continue
            point = _unescape(fields[4])
            if point == base or point.startswith(base + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))
