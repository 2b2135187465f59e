"""A seccomp filter for sandboxed turns: no pathname Unix socket outside, and every denial
reported to the supervisor through seccomp user notification (``SECCOMP_RET_USER_NOTIF``).

Landlock does not govern ``connect`` on a pathname Unix socket (docs/security.md), so a turn
could reach any world-writable socket of the host (D-Bus, X11, a container runtime). The filter,
built here as classic BPF bytes and installed by the launcher child after NO_NEW_PRIVS and
just before ``execve``, decides on integer arguments only:

* a foreign architecture (i386 ``int 0x80``, x32) -> ``ENOSYS`` (the checks below are for the
  x86_64 numbers; ``socketcall`` would bypass them);
* ``io_uring_setup`` -> ``EPERM`` (io_uring's socket and connect operations bypass seccomp);
* ``socket``/``socketpair`` of ``AF_UNIX`` with a type other than stream or seqpacket ->
  user notification (datagram sockets can ``sendto`` a path without ``connect``);
* every ``connect`` -> user notification.

The supervisor answers each notification itself (`NotificationServer`); it never lets the
kernel *continue* a notified call (that is unsafe: memory and fd tables may change between the
check and the call). For ``connect`` it takes a copy of the socket (``pidfd_getfd``): on an
``AF_UNIX`` socket it answers ``EACCES`` and reports a violation with the path it read, unless
that path does not exist (glibc's probe for nscd on every user lookup is no violation); a TCP
connect without the manifest's ``network`` grant gets ``EACCES`` (what Landlock's TCP rule says)
and is reported too; any other connect it performs itself on the copy (which is in the turn's
network namespace, so the result is the one the turn would have had) and returns its result.
The filter is not installed when the manifest grants ``unix_sockets``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import select
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import anyio
import structlog

__all__ = [
    "SECCOMP_MECHANISM",
    "KernelDenial",
    "NotificationServer",
    "build_filter",
    "install_filter",
    "receive_listener",
    "user_notif_available",
]

_log = structlog.get_logger("sandbox.confine.seccomp")

#: How an evidence entry names the mechanism that reported a denial.
SECCOMP_MECHANISM: Final = "seccomp-user-notif"

_AUDIT_ARCH_X86_64: Final = 0xC000003E
_X32_SYSCALL_BIT: Final = 0x40000000
_NR_SOCKET: Final = 41
_NR_CONNECT: Final = 42
_NR_SOCKETPAIR: Final = 53
_NR_IO_URING_SETUP: Final = 425
_NR_SECCOMP: Final = 317
_NR_PIDFD_GETFD: Final = 438

# classic BPF opcodes (linux/bpf_common.h)
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_AND_K: Final = 0x54
_RET_K: Final = 0x06

_RET_ALLOW: Final = 0x7FFF0000
_RET_USER_NOTIF: Final = 0x7FC00000
_RET_ERRNO: Final = 0x00050000

_OFF_NR: Final = 0
_OFF_ARCH: Final = 4
_OFF_ARG0: Final = 16
_OFF_ARG1: Final = 24

_SOCK_TYPE_MASK: Final = 0xF
_SOCK_STREAM: Final = 1
_SOCK_SEQPACKET: Final = 5

_SECCOMP_SET_MODE_FILTER: Final = 1
_SECCOMP_FILTER_FLAG_NEW_LISTENER: Final = 1 << 3

# ioctls of the listener (linux/seccomp.h): _IOWR('!', 0, seccomp_notif) and so on
_NOTIF_SIZE: Final = 80
_RESP_SIZE: Final = 24
_IOC_RECV: Final = 0xC0000000 | (_NOTIF_SIZE << 16) | (ord("!") << 8) | 0
_IOC_SEND: Final = 0xC0000000 | (_RESP_SIZE << 16) | (ord("!") << 8) | 1
_IOC_ID_VALID: Final = 0x40000000 | (8 << 16) | (ord("!") << 8) | 2
_NOTIF: Final = struct.Struct("<QIIiIQ6Q")
_RESP: Final = struct.Struct("<QqiI")
_SUN_PATH_MAX: Final = 108

_libc = ctypes.CDLL(None, use_errno=True)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def user_notif_available() -> str:
    """Why the filter cannot be used here ("" when it can)."""
    if platform.machine() != "x86_64":
        return f"the filter's syscall numbers are for x86_64, not {platform.machine()}"
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as handle:
            actions = handle.read().split()
    except OSError as exc:
        return f"no seccomp ({exc.strerror})"
    if "user_notif" not in actions:
        return "the kernel has no SECCOMP_RET_USER_NOTIF"
    return ""


def build_filter(*, notify: bool = True) -> bytes:
    """The filter program (``struct sock_filter[]`` bytes) described in the module comment.

    With ``notify=False`` (no listener) the notified calls fail with ``EACCES`` instead.
    """
    deny_unix = _RET_USER_NOTIF if notify else _RET_ERRNO | errno.EACCES
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JGE_K, 0, 1, _X32_SYSCALL_BIT),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ_K, 0, 1, _NR_IO_URING_SETUP),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        _insn(_JEQ_K, 0, 1, _NR_CONNECT),
        _insn(_RET_K, 0, 0, deny_unix),
        _insn(_JEQ_K, 1, 0, _NR_SOCKET),
        _insn(_JEQ_K, 0, 7, _NR_SOCKETPAIR),
        # socket/socketpair: AF_UNIX (domain, low 32 bits) with a type other than stream/seqpacket
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
        _insn(_JEQ_K, 0, 5, socket.AF_UNIX),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG1),
        _insn(_AND_K, 0, 0, _SOCK_TYPE_MASK),
        _insn(_JEQ_K, 2, 0, _SOCK_STREAM),
        _insn(_JEQ_K, 1, 0, _SOCK_SEQPACKET),
        _insn(_RET_K, 0, 0, deny_unix),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install_filter(program: bytes, notify_sock: int) -> None:  # pragma: no cover - child only
    """Install *program* in the calling process (the Python launcher's ``preexec_fn``); with
    *notify_sock* >= 0 send the listener fd over it and close it. NO_NEW_PRIVS must be set."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    flags = _SECCOMP_FILTER_FLAG_NEW_LISTENER if notify_sock >= 0 else 0
    fd = _libc.syscall(_NR_SECCOMP, _SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(prog))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")
    if notify_sock >= 0:
        with socket.socket(fileno=os.dup(notify_sock)) as sock:
            socket.send_fds(sock, [b"L"], [fd])
        os.close(fd)


def receive_listener(sock: socket.socket) -> int:
    """The listener fd the launcher child sent over *sock* (-1 when none arrived)."""
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return -1
    if not fds:
        return -1
    os.set_inheritable(fds[0], False)
    return fds[0]


@dataclass(frozen=True, slots=True)
class KernelDenial:
    """One call the filter stopped and the supervisor refused: what, on what, by whom."""

    operation: str
    target: str
    capability: str
    pid: int
    errno: int
    mechanism: str = SECCOMP_MECHANISM

    @property
    def detail(self) -> str:
        """The evidence entry's ``detail``: the mechanism that reported it and the answer."""
        return (
            f"denied and reported by {self.mechanism} "
            f"(pid {self.pid}, {errno.errorcode.get(self.errno, self.errno)})"
        )


@dataclass(frozen=True, slots=True)
class _Notification:
    id: int
    pid: int
    nr: int
    arch: int
    args: tuple[int, ...]


def _recv(listener: int) -> _Notification:
    buf = bytearray(_NOTIF_SIZE)
    fcntl.ioctl(listener, _IOC_RECV, buf, True)
    nid, pid, _flags, nr, arch, _ip, *args = _NOTIF.unpack(buf)
    return _Notification(nid, pid, nr, arch, tuple(args))


def _send(listener: int, nid: int, *, val: int = 0, err: int = 0) -> None:
    with contextlib.suppress(FileNotFoundError):  # the caller was killed meanwhile
        fcntl.ioctl(listener, _IOC_SEND, _RESP.pack(nid, val, -err, 0))


def _valid(listener: int, nid: int) -> bool:
    try:
        fcntl.ioctl(listener, _IOC_ID_VALID, struct.pack("<Q", nid))
    except OSError:
        return False
    return True


def _read_memory(pid: int, address: int, size: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, address)
    finally:
        os.close(fd)


def _unix_target(pid: int, raw: bytes) -> tuple[str, str | None]:
    """(target as recorded, path to check for existence or None) of a ``sockaddr_un``."""
    path = raw[2:]
    if not path:
        return "(unnamed)", None
    if path[0] == 0:
        return "@" + path[1:].split(b"\0", 1)[0].decode("utf-8", "replace"), None
    text = os.fsdecode(path.split(b"\0", 1)[0])
    check = text if text.startswith("/") else f"/proc/{pid}/cwd/{text}"
    return text, check


def _raw_connect(fd: int, address: bytes) -> int:
    """connect(2) on *fd* (closed here) with a raw ``sockaddr``; 0 or the errno."""
    try:
        buf = ctypes.create_string_buffer(address, len(address))
        if _libc.connect(fd, buf, len(address)) == 0:
            return 0
        return ctypes.get_errno()
    finally:
        os.close(fd)


class NotificationServer:
    """Answers the notifications of one turn's filter (one listener fd, closed by `close`).

    *report* is called with each `KernelDenial` (the attempt turns them into
    ``capability_violation`` evidence). `serve` returns when every process of the turn is gone.
    """

    def __init__(
        self, listener: int, report: Callable[[KernelDenial], None], *, network_granted: bool
    ) -> None:
        self.listener = listener
        self._report = report
        self.network_granted = network_granted
        self.answered = 0

    def close(self) -> None:
        """Close the listener: a notified call still pending fails with ``ENOSYS``."""
        if self.listener >= 0:
            os.close(self.listener)
            self.listener = -1

    async def serve(self) -> None:
        """Answer notifications until no process uses the filter any more."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.wait_readable(self.listener)
                events = dict(poller.poll(0)).get(self.listener, 0)
                if not events & select.POLLIN:
                    if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        return
                    continue
                try:
                    note = _recv(self.listener)
                except OSError as exc:  # ENOENT: the caller was killed before we read it
                    if exc.errno != errno.ENOENT:
                        raise
                    continue
                self.answered += 1
                work = self._answer(note)
                if work is not None:
                    tg.start_soon(_finish, work)

    def _answer(self, note: _Notification) -> Awaitable[None] | None:
        """Answer at once, or return the work that answers later (a connect done for the turn)."""
        if note.nr == _NR_CONNECT:
            return self._connect(note)
        domain = note.args[0] & 0xFFFFFFFF
        kind = note.args[1] & _SOCK_TYPE_MASK
        name = "socketpair" if note.nr == _NR_SOCKETPAIR else "socket"
        _send(self.listener, note.id, err=errno.EACCES)
        self._report(
            KernelDenial(
                operation=name,
                target=f"AF_UNIX socket of type {kind} (domain {domain})",
                capability="capabilities.unix_sockets",
                pid=note.pid,
                errno=errno.EACCES,
            )
        )
        return None

    def _connect(self, note: _Notification) -> Awaitable[None] | None:
        fd_arg, address, length = note.args[0], note.args[1], note.args[2] & 0xFFFFFFFF
        try:
            pidfd = os.pidfd_open(note.pid)
        except OSError:
            _send(self.listener, note.id, err=errno.ESRCH)
            return None
        try:
            if not _valid(self.listener, note.id):
                return None
            sock_fd = _libc.syscall(_NR_PIDFD_GETFD, pidfd, ctypes.c_int(fd_arg & 0xFFFFFFFF), 0)
            if sock_fd < 0:
                _send(self.listener, note.id, err=errno.EBADF)
                return None
        finally:
            os.close(pidfd)
        try:
            domain = _so_domain(sock_fd)
            raw = _read_memory(note.pid, address, min(length, 2 + _SUN_PATH_MAX)) if length else b""
        except OSError as exc:
            os.close(sock_fd)
            _send(self.listener, note.id, err=exc.errno or errno.EACCES)
            return None
        if domain is None:
            os.close(sock_fd)
            _send(self.listener, note.id, err=errno.ENOTSOCK)
            return None
        inet = domain in (socket.AF_INET, socket.AF_INET6)
        if (
            inet
            and not self.network_granted
            and _sockopt(sock_fd, socket.SO_TYPE) == socket.SOCK_STREAM
        ):
            # a TCP connect without the network capability: refused (as Landlock would) and
            # recorded; never performed for the turn (that would bypass Landlock's TCP rule)
            os.close(sock_fd)
            _send(self.listener, note.id, err=errno.EACCES)
            self._report(
                KernelDenial(
                    operation="connect",
                    target=_inet_target(raw),
                    capability="capabilities.network",
                    pid=note.pid,
                    errno=errno.EACCES,
                )
            )
            return None
        if domain != socket.AF_UNIX:
            return self._connect_for_turn(note, sock_fd, raw)
        os.close(sock_fd)
        target, check = _unix_target(note.pid, raw)
        # Always EACCES (an answer that depended on what root can see would tell the turn
        # whether paths it cannot reach exist); a path that does not exist is not recorded.
        _send(self.listener, note.id, err=errno.EACCES)
        if check is not None and not os.path.lexists(check):
            return None
        self._report(
            KernelDenial(
                operation="connect",
                target=target,
                capability="capabilities.unix_sockets",
                pid=note.pid,
                errno=errno.EACCES,
            )
        )
        return None

    async def _connect_for_turn(self, note: _Notification, sock_fd: int, raw: bytes) -> None:
        """connect() a non-Unix socket on the turn's behalf, in a worker thread."""
        err = await anyio.to_thread.run_sync(_raw_connect, sock_fd, raw, abandon_on_cancel=True)
        if self.listener >= 0:
            _send(self.listener, note.id, err=err)


async def _finish(work: Awaitable[None]) -> None:
    await work


def _inet_target(raw: bytes) -> str:
    """``host:port`` of a ``sockaddr_in``/``sockaddr_in6`` (as the turn passed it)."""
    family = int.from_bytes(raw[:2], "little") if len(raw) >= 2 else -1
    if family == socket.AF_INET and len(raw) >= 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[4:8])}:{int.from_bytes(raw[2:4], 'big')}"
    if family == socket.AF_INET6 and len(raw) >= 24:
        host = socket.inet_ntop(socket.AF_INET6, raw[8:24])
        return f"[{host}]:{int.from_bytes(raw[2:4], 'big')}"
    return "(unreadable address)"


def _so_domain(fd: int) -> int | None:
    return _sockopt(fd, socket.SO_DOMAIN)


def _sockopt(fd: int, option: int) -> int | None:
    """An integer socket option of *fd* (None when it is not a socket)."""
    value = ctypes.c_int(0)
    size = ctypes.c_uint32(ctypes.sizeof(value))
    if (
        _libc.getsockopt(fd, socket.SOL_SOCKET, option, ctypes.byref(value), ctypes.byref(size))
        != 0
    ):
        return None
    return value.value
