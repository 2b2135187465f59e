"""Who is on the other end of a Unix socket: SO_PEERCRED (Linux).

The kernel records the peer's pid, uid and gid when it connected; the peer cannot forge them.
The daemon checks the uid against ``allowed_uids`` before reading anything from the peer.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Final

import anyio.abc

__all__ = ["PeerCredentials", "peer_credentials", "stream_peer_credentials"]

_UCRED: Final = struct.Struct("3i")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The connecting process as the kernel saw it at ``connect()`` time."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCredentials | None:
    """Return the peer's credentials, or ``None`` when the socket is not a Unix socket."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def stream_peer_credentials(stream: anyio.abc.SocketStream) -> PeerCredentials | None:
    """``peer_credentials`` of the socket under an anyio socket stream (``None`` if unknown)."""
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None:
        return None
    return peer_credentials(sock)
