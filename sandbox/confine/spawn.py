"""The kernel-enforced launcher: start a turn's command confined, without forking Python.

Two launchers apply the same restrictions in the same order (see docs/sandbox.md):

* ``native`` -- the C extension ``sandbox.confine._spawn`` (clone with CLONE_VM|CLONE_VFORK, as
  posix_spawn does; costs about as much as a bare posix_spawn);
* ``python`` -- ``subprocess.Popen`` with a ``preexec_fn`` using ctypes (a full fork of the
  supervisor, ~2 ms more, and unsafe if other threads hold locks); used only when the
  extension was not built, and recorded as the ``launcher`` level.

Also here: the per-session network namespace (an empty one, loopback down), created by a
short-lived thread so the supervisor's own namespace never changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import socket
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sandbox.confine import landlock, seccomp
from sandbox.errors import SpawnError

__all__ = [
    "SpawnRequest",
    "Spawned",
    "native_available",
    "new_network_namespace",
    "spawn",
]

_CLONE_NEWNET: Final = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

try:
    from sandbox.confine import _spawn as _native  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - only without a C compiler at install time
    _native = None


def native_available() -> bool:
    """Whether the C launcher was built."""
    return _native is not None


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """Everything the launcher applies in the child, in this order.

    (``new_pid_ns``: the child is PID 1 of a new PID namespace, native launcher only) setsid;
    join ``netns_fd`` (-1: keep); write the pid into each ``cgroup_fds``; ``rlimits``;
    setgroups([]) + gid + uid (-1: keep); NO_NEW_PRIVS; chdir ``cwd``; Landlock
    ``landlock_fd`` (-1: none); stdin/stdout/stderr; the ``seccomp`` filter (with
    ``seccomp_notify`` its user-notification listener is handed to the parent, see
    `Spawned.listener_fd`); close every other fd; execve.
    """

    path: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    uid: int = -1
    gid: int = -1
    netns_fd: int = -1
    landlock_fd: int = -1
    #: ``landlock_restrict_self`` flags (`landlock.log_flags`: denials go to the audit log)
    landlock_flags: int = 0
    cgroup_fds: tuple[int, ...] = ()
    rlimits: tuple[tuple[int, int, int], ...] = ()
    seccomp: bytes | None = None
    seccomp_notify: bool = False
    new_pid_ns: bool = False


@dataclass(frozen=True, slots=True)
class Spawned:
    """A started child: its pid, a pidfd and the seccomp listener fd (-1: none; the caller
    closes both) and the launcher used."""

    pid: int
    pidfd: int
    launcher: str
    popen: subprocess.Popen[bytes] | None = None
    listener_fd: int = -1


def _spawn_native(req: SpawnRequest, notify_sock: int) -> Spawned:
    assert _native is not None
    env = [f"{k}={v}".encode() for k, v in req.env]
    try:
        pid, pidfd = _native.spawn(
            os.fsencode(req.path),
            [os.fsencode(a) for a in req.argv],
            env,
            os.fsencode(req.cwd),
            (req.stdin_fd, req.stdout_fd, req.stderr_fd),
            list(req.cgroup_fds),
            [tuple(r) for r in req.rlimits],
            req.uid,
            req.gid,
            req.netns_fd,
            req.landlock_fd,
            req.seccomp,
            notify_sock,
            int(req.new_pid_ns),
            req.landlock_flags,
        )
    except OSError as exc:
        msg = str(exc.strerror or exc)
        stage = msg.split(" at ", 1)[1].split(":", 1)[0] if " at " in msg else "clone"
        raise SpawnError(stage=stage, errno_=exc.errno or 0, message=msg) from None
    return Spawned(int(pid), int(pidfd), "native")


def _preexec(req: SpawnRequest, notify_sock: int) -> None:  # pragma: no cover - in the child
    if req.netns_fd >= 0 and _libc.setns(req.netns_fd, _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")
    pid = str(os.getpid()).encode()
    for fd in req.cgroup_fds:
        os.write(fd, pid)
    for res, soft, hard in req.rlimits:
        resource.setrlimit(res, (soft, hard))
    if req.gid >= 0:
        os.setgroups([])
        os.setresgid(req.gid, req.gid, req.gid)
    if req.uid >= 0:
        os.setresuid(req.uid, req.uid, req.uid)
    if req.landlock_fd >= 0:
        landlock.restrict_self(req.landlock_fd, req.landlock_flags)
    elif _libc.prctl(38, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")
    if req.seccomp is not None:
        seccomp.install_filter(req.seccomp, notify_sock)


def _spawn_python(req: SpawnRequest, notify_sock: int) -> Spawned:
    try:
        proc = subprocess.Popen(
            list(req.argv),
            executable=req.path,
            stdin=req.stdin_fd,
            stdout=req.stdout_fd,
            stderr=req.stderr_fd,
            cwd=req.cwd,
            env=dict(req.env),
            close_fds=True,
            start_new_session=True,
            restore_signals=True,
            preexec_fn=lambda: _preexec(req, notify_sock),  # noqa: PLW1509 - the documented fallback path
        )
    except subprocess.SubprocessError as exc:
        raise SpawnError(stage="preexec", errno_=0, message=str(exc)) from None
    except OSError as exc:
        raise SpawnError(stage="execve", errno_=exc.errno or 0, message=str(exc)) from None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        proc.kill()
        proc.wait()
        raise
    return Spawned(proc.pid, pidfd, "python", proc)


def spawn(req: SpawnRequest, *, launcher: str = "auto") -> Spawned:
    """Start the child with the requested launcher (``auto`` prefers ``native``)."""
    native = launcher == "native" or (launcher == "auto" and _native is not None)
    if native and _native is None:
        raise SpawnError(stage="launcher", errno_=0, message="sandbox.confine._spawn is not built")
    if req.new_pid_ns and not native:
        raise SpawnError(
            stage="launcher", errno_=0, message="a PID namespace needs the native launcher"
        )
    if req.seccomp is None or not req.seccomp_notify:
        return _spawn_native(req, -1) if native else _spawn_python(req, -1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if native:
            spawned = _spawn_native(req, theirs.fileno())
        else:  # preexec_fn runs before close_fds: the child still has the socket
            spawned = _spawn_python(req, theirs.fileno())
        listener = seccomp.receive_listener(ours)
    finally:
        ours.close()
        theirs.close()
    if listener < 0:  # the child cannot have exec'd without sending it
        with contextlib.suppress(ProcessLookupError):
            os.kill(spawned.pid, 9)
        reap(spawned)
        os.close(spawned.pidfd)
        raise SpawnError(stage="seccomp", errno_=0, message="no seccomp listener from the child")
    return dataclasses.replace(spawned, listener_fd=listener)


def reap(spawned: Spawned) -> int:
    """Collect the exited child's wait status (blocking only if it has not exited)."""
    _, status = os.waitpid(spawned.pid, 0)
    if spawned.popen is not None:
        # Tell Popen we reaped it ourselves (avoids its ResourceWarning).
        spawned.popen.returncode = os.waitstatus_to_exitcode(status)
    return status


def new_network_namespace() -> int:
    """Return an fd of a new, empty network namespace (only loopback, down).

    ``unshare(CLONE_NEWNET)`` changes only the calling thread, so a throwaway thread does
    it, opens ``/proc/thread-self/ns/net`` and exits; the fd keeps the namespace alive.
    """
    result: list[int] = []
    error: list[BaseException] = []

    def make() -> None:
        if _libc.unshare(_CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            error.append(OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}"))
            return
        try:
            result.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            error.append(exc)

    thread = threading.Thread(target=make, name="hunter-netns")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def close_quietly(fds: Sequence[int]) -> None:
    """Close every fd, ignoring ones already closed."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
