"""File-system identity of one thread: ``setfsuid``/``setfsgid`` for the span of a block.

The sandbox helper runs as root, but it promotes a turn's outputs into a workspace named by
the unprivileged daemon. It does so with the daemon's file-system identity (the peer of its
socket), so a workspace the daemon could not write itself is refused by the kernel, and the
promoted files belong to the daemon: the helper is no confused deputy for writes.

The file-system uid and gid are per thread (the kernel's credentials are; glibc does not
broadcast these two calls to the other threads): the block must not await (run it in one
worker thread). Changing the fsuid from 0 to another uid clears the thread's effective
file-system capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_CHOWN ...),
changing it back restores them (capabilities(7)).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

__all__ = ["FsIdentityError", "fs_identity"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setfsuid.argtypes = [ctypes.c_uint]
_libc.setfsuid.restype = ctypes.c_int
_libc.setfsgid.argtypes = [ctypes.c_uint]
_libc.setfsgid.restype = ctypes.c_int
_QUERY = 0xFFFFFFFF  # (uid_t)-1: fails, and answers the current value


class FsIdentityError(OSError):
    """The thread's file-system identity could not be switched (or switched back)."""


def _set(call: ctypes._NamedFuncPointer, value: int, what: str) -> int:
    previous = int(call(value))
    now = int(call(_QUERY))
    if now != value:
        raise FsIdentityError(f"{what}({value}) left it at {now}")
    return previous


@contextlib.contextmanager
def fs_identity(uid: int, gid: int) -> Iterator[None]:
    """File-system accesses of this thread inside the block are made as *uid*:*gid*."""
    old_gid = _set(_libc.setfsgid, gid, "setfsgid")
    try:
        old_uid = _set(_libc.setfsuid, uid, "setfsuid")
    except BaseException:
        _set(_libc.setfsgid, old_gid, "setfsgid")
        raise
    try:
        yield
    finally:
        _set(_libc.setfsuid, old_uid, "setfsuid")
        _set(_libc.setfsgid, old_gid, "setfsgid")
