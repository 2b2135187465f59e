"""Frames in from the daemon without a reader task: the socket is read by an event-loop callback.

On asyncio with anyio's Unix socket stream (what ``run_executor`` connects), ``Inbox.attach``
registers the socket with the loop once for the whole connection (``loop.add_reader``). Each
time it is readable the callback takes one chunk, splits every complete frame out of it and
hands each body to ``on_body``, in the same call: no task wakes up to read, and the socket is
not registered and unregistered around every read. Elsewhere (another backend, another kind of
stream) ``attach`` returns False and the connection reads with a task (``FrameReader``).

The frame rules are those of ``supervisor.wire.frames``: a 4-byte big-endian length, at least 2
and at most ``max_bytes`` body bytes (a frame announced larger is refused from its header). The
inbox ends once, through ``on_end(reason)``: the daemon closed the stream (mid-frame: a protocol
error), the socket broke, a frame broke the rules, or ``on_body`` raised ``FrameError`` /
``ProtocolError`` (or returned a reason to stop, e.g. for a ``reject``).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import Final

from anyio.abc import SocketAttribute, SocketStream

from supervisor.wire.executor import ProtocolError
from supervisor.wire.frames import (
    HEADER_SIZE,
    FrameDecodeError,
    FrameError,
    FrameTooLarge,
    FrameTruncated,
)

__all__ = ["Inbox"]

_HEADER: Final = struct.Struct(">I")
_CHUNK: Final = 65_536
_MIN_BODY: Final = 2


class Inbox:
    """The daemon's frames, read by a loop callback (see the module docs)."""

    __slots__ = ("_buffer", "_loop", "_on_body", "_on_end", "_sock", "max_bytes")

    def __init__(
        self,
        *,
        on_body: Callable[[bytes], str | None],
        on_end: Callable[[str], None],
        max_bytes: int,
    ) -> None:
        self._on_body = on_body
        self._on_end = on_end
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, stream: SocketStream) -> bool:
        """Start reading *stream* from the loop; False (nothing done) where it cannot."""
        kind = type(stream)
        if kind.__name__ != "UNIXSocketStream" or kind.__module__ != "anyio._backends._asyncio":
            return False
        sock = stream.extra(SocketAttribute.raw_socket, None)
        if not isinstance(sock, socket.socket) or sock.family != socket.AF_UNIX:
            return False
        self._sock = sock
        self._loop = asyncio.get_running_loop()  # the stream is asyncio's: so is the loop
        self._loop.add_reader(sock.fileno(), self._readable)
        return True

    def detach(self) -> None:
        """Stop reading (idempotent); before the socket is closed."""
        sock, self._sock = self._sock, None
        if sock is not None and self._loop is not None and sock.fileno() >= 0:
            self._loop.remove_reader(sock.fileno())

    def _end(self, reason: str) -> None:
        if self._sock is not None:
            self.detach()
            self._on_end(reason)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            chunk = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end(f"connection lost: {exc!r}")
            return
        buffer = self._buffer
        if not chunk:
            if buffer:
                expected = (
                    _HEADER.unpack_from(buffer)[0] + HEADER_SIZE
                    if len(buffer) >= HEADER_SIZE
                    else None
                )
                truncated = FrameTruncated(received=len(buffer), expected=expected)
                self._end(f"protocol error from the daemon: {truncated}")
            else:
                self._end("the daemon closed the connection")
            return
        buffer += chunk
        try:
            stop = self._split(buffer)
        except (FrameError, ProtocolError) as exc:
            self._end(f"protocol error from the daemon: {exc}")
            return
        except Exception as exc:  # a bug of ours: end the connection, never leave it hanging
            self._end(f"the SDK failed on a frame: {exc!r}")
            raise
        if stop is not None:
            self._end(stop)

    def _split(self, buffer: bytearray) -> str | None:
        """Hand every complete frame of *buffer* to ``on_body``; keep the rest."""
        start = 0
        end_of_data = len(buffer)
        on_body = self._on_body
        try:
            while end_of_data - start >= HEADER_SIZE:
                (size,) = _HEADER.unpack_from(buffer, start)
                if size > self.max_bytes:
                    raise FrameTooLarge(size=size, max_bytes=self.max_bytes)
                if size < _MIN_BODY:
                    msg = f"frame body of {size} bytes cannot hold a JSON object"
                    raise FrameDecodeError(msg)
                end = start + HEADER_SIZE + size
                if end > end_of_data:
                    break
                body = bytes(buffer[start + HEADER_SIZE : end])
                start = end
                stop = on_body(body)
                if stop is not None:
                    return stop
        finally:
            del buffer[:start]
        return None
