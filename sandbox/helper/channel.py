"""A session's connection to the sandbox helper, kept between its requests.

A session's process turns run one at a time, so one connection serves all of its requests,
one after the other: no connect, accept or new task in the helper per request. It is a plain
non-blocking socket waited on with `anyio.wait_readable`/`wait_writable`, so it belongs to no
event loop and closes synchronously. Cancelling a request closes the connection (the helper
then cancels what it was doing, a confined run is killed); the next request connects again. A
connection the helper closed meanwhile (it stopped or was restarted) shows as end-of-file,
peeked without blocking before it is used.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from pathlib import Path
from typing import Final

import anyio

from sandbox.helper import wire

__all__ = ["Channel"]

#: How long a request waits for a helper that is not listening (a restart) before it fails.
RECONNECT_S: Final = 10.0


class Channel:
    """One connection to the helper at *path*, used by one request at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    async def request(self, frame: bytes, *, timeout_s: float) -> bytes:
        """Send *frame*, return the reply's body. ``OSError`` (``ConnectionResetError`` at
        end-of-file) when the helper cannot be reached or goes away; ``TimeoutError``."""
        sock = self._idle() or await self._connect()
        try:
            with anyio.fail_after(timeout_s):
                # the helper may refuse a connection (and close it) before reading: read why
                with contextlib.suppress(BrokenPipeError):
                    await _send_all(sock, frame)
                header = await _recv_exactly(sock, wire.HEADER_SIZE)
                body = await _recv_exactly(sock, wire.frame_length(header))
        except BaseException:
            sock.close()
            raise
        if self._sock is None:
            self._sock = sock
        else:  # another request ran meanwhile and kept its own: keep one
            sock.close()
        return body

    def _idle(self) -> socket.socket | None:
        sock, self._sock = self._sock, None
        if sock is None:
            return None
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return sock  # open, and nothing unasked to read
        except OSError:
            pass
        sock.close()  # end-of-file: the helper stopped; or bytes it never sends unasked
        return None

    async def _connect(self) -> socket.socket:
        delay = 0.02
        deadline = anyio.current_time() + RECONNECT_S
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            try:
                try:
                    sock.connect(str(self.path))
                except BlockingIOError:  # a full backlog: wait for the helper to accept
                    await anyio.wait_writable(sock)
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        raise OSError(code, errno.errorcode.get(code, "connect failed")) from None
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if anyio.current_time() + delay > deadline:
                    raise
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            except BaseException:
                sock.close()
                raise
            return sock


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await anyio.wait_writable(sock)
            continue
        view = view[sent:]


async def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        try:
            chunk = sock.recv(min(size, 1 << 20))
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "the helper closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
