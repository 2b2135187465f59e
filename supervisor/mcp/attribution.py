"""Who asks for a turn through `hunter mcp`: the MCP client as its handshake named it, and this
server instance (name, version, uid, pid), as the typed `RequestedBy` every submission carries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from supervisor import __version__
from supervisor.wire.turn_spec import RequestedBy

__all__ = ["ServerInstance", "requested_by"]

#: the name used when the client did not name itself (a client of the sessionless protocol)
UNNAMED_CLIENT: Final = "unnamed-mcp-client"
_NAME_MAX: Final = 256
_VERSION_MAX: Final = 128


@dataclass(frozen=True, slots=True)
class ServerInstance:
    """This process as a front end of the daemon."""

    name: str
    version: str
    uid: int
    pid: int

    @classmethod
    def here(cls, name: str) -> ServerInstance:
        return cls(name=name, version=__version__, uid=os.getuid(), pid=os.getpid())


def _bounded(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    cleaned = "".join(ch for ch in text if ch.isprintable())[:limit]
    return cleaned or None


def requested_by(
    server: ServerInstance, client_name: str | None, client_version: str | None
) -> RequestedBy:
    """The ``requested_by`` of a turn asked for by the MCP client *client_name* (its handshake's
    ``clientInfo``; printable characters, cut to the wire's bounds)."""
    return RequestedBy(
        via="mcp",
        client_name=_bounded(client_name, _NAME_MAX) or UNNAMED_CLIENT,
        client_version=_bounded(client_version, _VERSION_MAX),
        server_name=server.name[:_NAME_MAX],
        server_version=server.version[:_VERSION_MAX],
        uid=server.uid,
        pid=server.pid,
    )
