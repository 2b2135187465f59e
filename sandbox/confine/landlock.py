"""Landlock rulesets for sandboxed turns (Linux >= 5.13), built with ctypes in the parent.

The supervisor builds the ruleset (create + add rules) in its own process; the launcher
child only calls ``landlock_restrict_self`` with the ruleset fd after PR_SET_NO_NEW_PRIVS.
Every access right the running kernel's ABI knows is *handled*; only the rights granted by a
rule are allowed beneath that rule's directory (or on that file). See docs/sandbox.md for what
Landlock enforces here and what it does not (pathname Unix sockets, UDP, chmod as root, fds
that are already open).
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from enum import IntFlag
from pathlib import Path
from typing import Final

__all__ = [
    "ACCESS_EXEC",
    "ACCESS_READ",
    "ACCESS_WRITE_TREE",
    "AUDIT_ABI",
    "FILE_ACCESS_MASK",
    "FsAccess",
    "LandlockRules",
    "LandlockUnavailableError",
    "NetAccess",
    "Scope",
    "abi_version",
    "build_ruleset",
    "handled_fs_for_abi",
    "log_flags",
    "restrict_self",
]

# x86_64 / aarch64 share these numbers (generic syscall table for Landlock).
_SYS_CREATE_RULESET: Final = 444
_SYS_ADD_RULE: Final = 445
_SYS_RESTRICT_SELF: Final = 446
#: The first Landlock ABI whose domains log denials to the kernel audit (Linux 6.15).
AUDIT_ABI: Final = 7
_RESTRICT_SELF_LOG_NEW_EXEC_ON: Final = 1 << 1
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1
_RULE_NET_PORT: Final = 2
_PR_SET_NO_NEW_PRIVS: Final = 38


class FsAccess(IntFlag):
    """LANDLOCK_ACCESS_FS_* bits (uapi/linux/landlock.h)."""

    EXECUTE = 1 << 0
    WRITE_FILE = 1 << 1
    READ_FILE = 1 << 2
    READ_DIR = 1 << 3
    REMOVE_DIR = 1 << 4
    REMOVE_FILE = 1 << 5
    MAKE_CHAR = 1 << 6
    MAKE_DIR = 1 << 7
    MAKE_REG = 1 << 8
    MAKE_SOCK = 1 << 9
    MAKE_FIFO = 1 << 10
    MAKE_BLOCK = 1 << 11
    MAKE_SYM = 1 << 12
    REFER = 1 << 13  # ABI 2
    TRUNCATE = 1 << 14  # ABI 3
    IOCTL_DEV = 1 << 15  # ABI 5


class NetAccess(IntFlag):
    """LANDLOCK_ACCESS_NET_* bits (ABI 4)."""

    BIND_TCP = 1 << 0
    CONNECT_TCP = 1 << 1


class Scope(IntFlag):
    """LANDLOCK_SCOPE_* bits (ABI 6)."""

    ABSTRACT_UNIX_SOCKET = 1 << 0
    SIGNAL = 1 << 1


#: Rights that may be granted on a file (not a directory) rule.
FILE_ACCESS_MASK: Final = (
    FsAccess.EXECUTE
    | FsAccess.WRITE_FILE
    | FsAccess.READ_FILE
    | FsAccess.TRUNCATE
    | FsAccess.IOCTL_DEV
)
#: Read-only roots: read files and list directories.
ACCESS_READ: Final = FsAccess.READ_FILE | FsAccess.READ_DIR
#: Executables: run them (and read them, scripts need it).
ACCESS_EXEC: Final = FsAccess.EXECUTE | FsAccess.READ_FILE | FsAccess.READ_DIR
#: The session's writable trees: regular files and directories only (no symlinks, sockets,
#: FIFOs or device nodes can be made; nothing there can be executed).
ACCESS_WRITE_TREE: Final = (
    FsAccess.READ_FILE
    | FsAccess.READ_DIR
    | FsAccess.WRITE_FILE
    | FsAccess.REMOVE_DIR
    | FsAccess.REMOVE_FILE
    | FsAccess.MAKE_DIR
    | FsAccess.MAKE_REG
    | FsAccess.REFER
    | FsAccess.TRUNCATE
)


class LandlockUnavailableError(OSError):
    """Raised when the kernel has no (usable) Landlock or a ruleset cannot be built."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

_abi_cache: list[int] = []


def abi_version() -> int:
    """Return the kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    if not _abi_cache:
        res = _syscall(
            ctypes.c_long(_SYS_CREATE_RULESET),
            ctypes.c_void_p(None),
            ctypes.c_size_t(0),
            ctypes.c_uint32(_CREATE_RULESET_VERSION),
        )
        _abi_cache.append(max(int(res), 0))
    return _abi_cache[0]


def handled_fs_for_abi(abi: int) -> FsAccess:
    """Every filesystem right the given ABI version knows."""
    mask = FsAccess(0)
    for bit in FsAccess:
        if bit in (FsAccess.REFER,) and abi < 2:
            continue
        if bit is FsAccess.TRUNCATE and abi < 3:
            continue
        if bit is FsAccess.IOCTL_DEV and abi < 5:
            continue
        mask |= bit
    return mask


@dataclass(frozen=True, slots=True)
class LandlockRules:
    """A complete Landlock policy: handled rights plus the allow rules.

    ``paths`` maps a path to the rights allowed beneath it (file rules are masked to
    FILE_ACCESS_MASK). ``tcp_ports`` lists ports allowed for BIND/CONNECT when network is
    handled. ``handle_net`` False leaves TCP unrestricted (network granted).
    """

    paths: tuple[tuple[str, int], ...]
    handle_net: bool = True
    tcp_ports: tuple[tuple[int, int], ...] = ()
    scope: bool = True


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    msg = f"landlock {what} failed: {os.strerror(err)}"
    raise LandlockUnavailableError(err, msg)


def build_ruleset(rules: LandlockRules, *, abi: int | None = None) -> tuple[int, dict[str, str]]:
    """Create a ruleset fd (O_CLOEXEC) from *rules*; return it with per-feature levels.

    Paths that do not exist are skipped (recorded as ``missing`` in the returned notes).
    The caller closes the fd.
    """
    level = abi_version() if abi is None else abi
    if level < 1:
        raise LandlockUnavailableError(errno.ENOSYS, "landlock is not available on this kernel")
    handled_fs = int(handled_fs_for_abi(level))
    handled_net = int(NetAccess.BIND_TCP | NetAccess.CONNECT_TCP) if rules.handle_net else 0
    notes: dict[str, str] = {"landlock_abi": str(level)}
    if level < 4:
        handled_net = 0
        notes["landlock_net"] = "unsupported"
    else:
        notes["landlock_net"] = "enforced" if rules.handle_net else "granted"
    scoped = 0
    if rules.scope and level >= 6:
        scoped = int(Scope.ABSTRACT_UNIX_SOCKET | Scope.SIGNAL)
        notes["landlock_scope"] = "enforced"
    else:
        notes["landlock_scope"] = "unsupported" if level < 6 else "off"
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    size = ctypes.sizeof(_RulesetAttr) if level >= 6 else (16 if level >= 4 else 8)
    fd = int(
        _syscall(
            ctypes.c_long(_SYS_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(size),
            ctypes.c_uint32(0),
        )
    )
    if fd < 0:
        _raise_errno("create_ruleset")
    try:
        missing: list[str] = []
        for path, access in rules.paths:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                missing.append(path)
                continue
            try:
                allowed = access & handled_fs
                if not os.path.isdir(f"/proc/self/fd/{pfd}"):
                    allowed &= int(FILE_ACCESS_MASK)
                pb = _PathBeneathAttr(allowed, pfd)
                res = _syscall(
                    ctypes.c_long(_SYS_ADD_RULE),
                    ctypes.c_int(fd),
                    ctypes.c_int(_RULE_PATH_BENEATH),
                    ctypes.byref(pb),
                    ctypes.c_uint32(0),
                )
                if res < 0:
                    _raise_errno(f"add_rule({path})")
            finally:
                os.close(pfd)
        if handled_net:
            for port, access in rules.tcp_ports:
                np_attr = _NetPortAttr(access & handled_net, port)
                res = _syscall(
                    ctypes.c_long(_SYS_ADD_RULE),
                    ctypes.c_int(fd),
                    ctypes.c_int(_RULE_NET_PORT),
                    ctypes.byref(np_attr),
                    ctypes.c_uint32(0),
                )
                if res < 0:
                    _raise_errno(f"add_rule(port {port})")
        if missing:
            notes["landlock_missing_paths"] = ",".join(missing)
    except BaseException:
        os.close(fd)
        raise
    return fd, notes


def log_flags(abi: int) -> int:
    """``landlock_restrict_self`` flags that send the domain's denials to the audit log even
    after ``execve`` (ABI >= 7; off by default, and refused as EINVAL by older kernels)."""
    return _RESTRICT_SELF_LOG_NEW_EXEC_ON if abi >= AUDIT_ABI else 0


def restrict_self(ruleset_fd: int, flags: int = 0) -> None:
    """Apply a ruleset to the calling thread (sets PR_SET_NO_NEW_PRIVS first).

    Only for the pure-Python launcher's ``preexec_fn``; the native launcher does this itself.
    """
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _raise_errno("prctl(NO_NEW_PRIVS)")
    res = _syscall(
        ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(flags)
    )
    if res < 0:
        _raise_errno("restrict_self")


def is_dir(path: Path) -> bool:
    """Whether *path* is a directory (helper kept here so callers mask file rules alike)."""
    return path.is_dir()
