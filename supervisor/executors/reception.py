"""The door of ``executors.sock``: the listener, who may come in, the ``hello``, rejects.

``open_executor_listener`` creates the socket. For each new connection, ``Reception.greet``
checks the peer's uid (SO_PEERCRED) before reading anything, refuses everyone while the hub
closes, and reads the ``hello`` (bounded by ``hello_timeout_s``); every refusal is a ``reject``
frame the peer gets to read before the close (docs/protocol.md). The hub then decides the
refusals that need its registry (quarantine, duplicate id) and sends the ``welcome``.
"""

from __future__ import annotations

import os
from typing import Final, Never

import anyio
import anyio.abc

from supervisor.executors.clock import ms
from supervisor.executors.host import ConnectionHost
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Hello,
    ProtocolError,
    Reject,
    RejectReason,
    Welcome,
    decode_hello,
)
from supervisor.wire.frames import FrameError, FrameReader, decode_body, encode_frame

__all__ = ["REJECT_DRAIN_S", "Reception", "open_executor_listener"]

REJECT_DRAIN_S: Final = 1.0


async def open_executor_listener(
    path: str | os.PathLike[str], *, mode: int = 0o660
) -> anyio.abc.SocketListener:
    """Create the Unix listener for ``executors.sock`` with ``mode`` (0660 by default).

    A stale socket file (nobody accepting on it) is removed first; a live one raises
    ``OSError`` (another daemon owns it).
    """
    target = os.fspath(path)
    if os.path.exists(target):  # noqa: ASYNC240 - one stat at startup, not on a hot path
        try:
            probe = await anyio.connect_unix(target)
        except OSError:
            os.unlink(target)
        else:
            await probe.aclose()
            raise OSError(f"{target} is in use by a running daemon")
    return await anyio.create_unix_listener(target, mode=mode)


class Reception:
    """Greets new connections and rejects the ones refused; counts the rejects."""

    __slots__ = ("_host", "_log", "rejected")

    def __init__(self, *, host: ConnectionHost[Never], log: EventLog) -> None:
        # ``Never``: any host (reception tells it of no connection; the seam is contravariant
        # in the connection it is told about)
        self._host = host
        self._log = log
        self.rejected = 0

    async def greet(
        self,
        stream: anyio.abc.SocketStream,
        creds: PeerCredentials | None,
        *,
        allowed_uids: frozenset[int],
        closing: bool,
    ) -> tuple[Hello, FrameReader] | None:
        """The peer's valid ``hello`` and the reader after it; ``None`` if it was refused."""
        if creds is not None and creds.uid not in allowed_uids:
            await self.reject(
                stream,
                Reject(
                    RejectReason.UID_NOT_ALLOWED,
                    f"uid {creds.uid} is not allowed to connect as an executor",
                ),
                executor_id=None,
                creds=creds,
            )
            return None
        if closing:
            await self.reject(
                stream,
                Reject(RejectReason.HUB_CLOSING, "the daemon is shutting down", 1000),
                executor_id=None,
                creds=creds,
            )
            return None
        reader = FrameReader(stream, max_bytes=self._host.settings.max_frame_bytes)
        try:
            with anyio.fail_after(self._host.settings.hello_timeout_s):
                body = await reader.read_body()
            hello = decode_hello(body)  # one step: a hello that decodes is valid
        except TimeoutError:
            await self.reject(
                stream,
                Reject(
                    RejectReason.HELLO_TIMEOUT,
                    f"no hello within {self._host.settings.hello_timeout_s:g}s",
                ),
                executor_id=None,
                creds=creds,
            )
            return None
        except anyio.EndOfStream:
            return None
        except FrameError as exc:
            self._host.frame_error(exc, executor_id=None, in_flight=[], creds=creds)
            # docs/protocol.md: a first frame that is not a hello is answered with a reject.
            await self.reject(
                stream,
                Reject(RejectReason.BAD_MESSAGE, f"the first frame must be a hello: {exc}"),
                executor_id=None,
                creds=creds,
            )
            return None
        except ProtocolError as exc:
            executor_id = decode_body(body).get("executor_id")  # a JSON object: it got this far
            await self.reject(
                stream,
                Reject(exc.reason_code, exc.reason),
                executor_id=executor_id if isinstance(executor_id, str) else None,
                creds=creds,
            )
            return None
        return hello, reader

    async def welcome(self, stream: anyio.abc.SocketStream, executor_id: str) -> None:
        """Accept the executor: send the limits the hub will enforce."""
        settings = self._host.settings
        welcome = Welcome(
            executor_id=executor_id,
            protocol_version=PROTOCOL_VERSION,
            heartbeat_interval_ms=ms(settings.heartbeat_interval_s),
            heartbeat_misses=settings.heartbeat_misses,
            max_frame_bytes=settings.max_frame_bytes,
        )
        await stream.send(encode_frame(welcome.to_wire()))

    async def reject(
        self,
        stream: anyio.abc.SocketStream,
        reject: Reject,
        *,
        executor_id: str | None,
        creds: PeerCredentials | None,
    ) -> None:
        """Log and send ``reject``, then drain until the peer closes (briefly)."""
        self.rejected += 1
        self._log.warning(
            "executor_rejected",
            executor_id=executor_id,
            reason_code=reject.reason_code,
            reason=reject.reason,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
        )
        try:
            await stream.send(encode_frame(reject.to_wire()))
            await stream.send_eof()
            # Read until the peer closes so it sees the reject (no RST), but not for long.
            with anyio.move_on_after(REJECT_DRAIN_S):
                while True:
                    await stream.receive(65_536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
