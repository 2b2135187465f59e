"""systemd integration without libsystemd: sd_notify, the watchdog, and socket activation.

- `notify("READY=1", "STATUS=...")` sends one datagram to `$NOTIFY_SOCKET` (a path, or an
  abstract name written with a leading '@'); without `$NOTIFY_SOCKET` it does nothing. The unit
  uses `NotifyAccess=main`, so call it from the daemon's main process (any thread).
- `watchdog_interval()` reads `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, which must be this
  process): the full interval in seconds, or None when the watchdog is off. Ping at half of it;
  `watchdog_loop()` does exactly that *from the event loop*, so a blocked loop stops pinging and
  systemd kills and restarts the daemon (Result=watchdog).
- `status_loop(describe, interval)` keeps `STATUS=` live: it sends `describe()` (one line, such
  as "3 turns active, 1 queued, ...") every interval while it changes, from the event loop; what
  `systemctl status` shows is then at most one interval old.
- `listen_fds()` takes the sockets systemd passed (`$LISTEN_FDS`, `$LISTEN_PID`,
  `$LISTEN_FDNAMES`; fds from 3), keyed by the unit's `FileDescriptorName=` ("control",
  "executors"), marks them close-on-exec and removes the variables so children never see them.

The protocol: https://www.freedesktop.org/software/systemd/man/sd_notify.html and
sd_listen_fds(3). Everything here is synchronous and cheap except `watchdog_loop`.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping, MutableMapping

import anyio
import anyio.abc

__all__ = [
    "SD_LISTEN_FDS_START",
    "listen_fds",
    "notify",
    "status_loop",
    "watchdog_interval",
    "watchdog_loop",
]

# The first fd systemd passes (sd-daemon.h: SD_LISTEN_FDS_START).
SD_LISTEN_FDS_START = 3


def _address(env: Mapping[str, str]) -> str | None:
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return None
    if path.startswith("@"):  # abstract namespace: a leading NUL byte
        return "\0" + path[1:]
    if path.startswith("/"):
        return path
    return None  # vsock and other schemes are not used by this daemon


def notify(*states: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `states` (e.g. "READY=1", "STATUS=draining", "WATCHDOG=1", "STOPPING=1") to systemd.

    Returns True when a datagram was sent, False when there is no `$NOTIFY_SOCKET` or the send
    failed (an unreachable notify socket never takes the daemon down; systemd notices a missing
    READY=1 or WATCHDOG=1 by itself).
    """
    if not states:
        return False
    for state in states:
        if "\n" in state:
            msg = f"a notify state must be one line: {state!r}"
            raise ValueError(msg)
    address = _address(os.environ if env is None else env)
    if address is None:
        return False
    payload = "\n".join(states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
    except OSError:
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The watchdog interval in seconds (`WatchdogSec=`), or None when it is not enabled for
    this process. Send WATCHDOG=1 at least every half of it (`watchdog_loop` does)."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000


def listen_fds(
    *, environ: MutableMapping[str, str] | None = None, unset_environment: bool = True
) -> dict[str, socket.socket]:
    """The sockets systemd passed to this process, by `FileDescriptorName=`.

    Empty when `$LISTEN_PID` is missing or names another process (the variables were inherited,
    not meant for us). An fd without a name is called "unknown" (as in sd_listen_fds_with_names);
    when several fds share a name, the later ones get "#2", "#3"... appended. Each fd is set
    close-on-exec. With `unset_environment` (the default) the three variables are removed.
    """
    env = os.environ if environ is None else environ
    try:
        pid = int(env.get("LISTEN_PID", ""))
        count = int(env.get("LISTEN_FDS", ""))
    except ValueError:
        pid, count = 0, 0
    names_var = env.get("LISTEN_FDNAMES")
    if unset_environment:
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(name, None)
    if pid != os.getpid() or count <= 0:
        return {}
    names = names_var.split(":") if names_var else []
    result: dict[str, socket.socket] = {}
    for index in range(count):
        fd = SD_LISTEN_FDS_START + index
        os.set_inheritable(fd, False)
        name = names[index] if index < len(names) and names[index] else "unknown"
        key, n = name, 1
        while key in result:
            n += 1
            key = f"{name}#{n}"
        result[key] = socket.socket(fileno=fd)
    return result


async def watchdog_loop(
    *,
    interval: float | None = None,
    healthy: Callable[[], bool] | None = None,
    env: Mapping[str, str] | None = None,
    task_status: anyio.abc.TaskStatus[float | None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Ping WATCHDOG=1 every half interval from the event loop, until cancelled.

    `interval` defaults to `watchdog_interval()`; when the watchdog is off this returns at once
    (after `task_status.started(None)`). `healthy`, if given, is asked before each ping; a False
    answer skips the ping, so systemd restarts a daemon that reports itself unhealthy.
    `task_status.started()` reports the ping period in seconds.
    """
    full = watchdog_interval(env) if interval is None else interval
    if full is None or not math.isfinite(full) or full <= 0:
        task_status.started(None)
        return
    period = full / 2
    task_status.started(period)
    while True:
        if healthy is None or healthy():
            notify("WATCHDOG=1", env=env)
        await anyio.sleep(period)


async def status_loop(
    describe: Callable[[], str],
    *,
    interval: float,
    env: Mapping[str, str] | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Send ``STATUS=<describe()>`` now and then every *interval* seconds when the text changed,
    until cancelled. Without `$NOTIFY_SOCKET` this returns at once (nothing would read it).
    A newline in the text is replaced by a space (a notify state is one line)."""
    if _address(os.environ if env is None else env) is None:
        task_status.started()
        return
    sent: str | None = None
    started = False
    while True:
        text = " ".join(describe().splitlines())
        if text != sent and notify(f"STATUS={text}", env=env):
            sent = text
        if not started:
            started = True
            task_status.started()
        await anyio.sleep(interval)
