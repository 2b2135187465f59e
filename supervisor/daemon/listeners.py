"""The daemon's listening sockets: the ones systemd passed (``LISTEN_FDNAMES`` ``control`` /
``executors``), else ``control.sock`` and ``executors.sock`` created with ``socket_mode`` (a
stale file unlinked first: the caller holds the root's lock), and the ``[metrics]`` listener
(loopback TCP or a Unix socket). Either all open or none stays open."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from supervisor.config import Config
from supervisor.metrics import TcpAddress, parse_listen

__all__ = ["Listeners", "open_listeners"]


@dataclass(frozen=True, slots=True)
class Listeners:
    """The open listeners; *created*: the socket files made here (unlinked at the end)."""

    control: anyio.abc.SocketListener
    executors: anyio.abc.SocketListener
    created: tuple[Path, ...]
    metrics: anyio.abc.Listener[anyio.abc.SocketStream] | None = None


def _bind_unix(path: Path, mode: int) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()  # stale: we hold the root's lock, so nobody serves it
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(4096)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _open_metrics_listener(
    listen: str, mode: int, created: list[Path]
) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    where = parse_listen(listen)
    if isinstance(where, TcpAddress):
        return await anyio.create_tcp_listener(local_host=where.host, local_port=where.port)
    listener = await anyio.abc.SocketListener.from_socket(_bind_unix(where, mode))
    created.append(where)
    return listener


async def open_listeners(config: Config, activated: Mapping[str, socket.socket]) -> Listeners:
    """Open every listener of *config*; *activated*: the sockets systemd passed, by name."""
    created: list[Path] = []
    listeners: dict[str, anyio.abc.SocketListener] = {}
    metrics: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
    try:
        for name, path in (
            ("control", config.control_socket),
            ("executors", config.executor_socket),
        ):
            sock = activated.get(name)
            if sock is not None:
                sock.setblocking(False)
                listeners[name] = await anyio.abc.SocketListener.from_socket(sock)
            else:
                sock = _bind_unix(path, config.socket_mode)
                listeners[name] = await anyio.abc.SocketListener.from_socket(sock)
                created.append(path)
        if config.metrics.listen:
            metrics = await _open_metrics_listener(
                config.metrics.listen, config.socket_mode, created
            )
    except BaseException:
        for listener in listeners.values():
            await listener.aclose()
        for path in created:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        raise
    return Listeners(listeners["control"], listeners["executors"], tuple(created), metrics)
