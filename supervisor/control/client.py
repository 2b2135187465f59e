"""Client of the control API (``control.sock``), used by the `hunter` command, the demo and tests.

`ControlClient` is an async context manager holding one connection; `call` may be used by many
tasks at once (requests are pipelined and matched by id). `socket_for_root` says where the
daemon for a root listens; `DaemonNotRunning` says clearly which socket was tried and how to
start a daemon.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning
from supervisor.wire.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameError,
    FrameReader,
    FrameWriter,
    encode_frame,
)

__all__ = [
    "ControlClient",
    "ControlClientError",
    "DaemonNotRunning",
    "socket_for_root",
]


def socket_for_root(root: Path) -> Path:
    """The control socket of the daemon serving *root* (``<root>/run/control.sock``)."""
    return root / "run" / "control.sock"


class ControlClient:
    """One connection to the control API; see the module docstring."""

    def __init__(self, socket_path: Path, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.socket_path = socket_path
        self._max_frame_bytes = max_frame_bytes
        self._stream: anyio.abc.SocketStream | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._writer: FrameWriter | None = None
        self._closed = False

    async def __aenter__(self) -> ControlClient:
        try:
            self._stream = await anyio.connect_unix(self.socket_path)
        except FileNotFoundError:
            raise DaemonNotRunning(self.socket_path, "no such socket file") from None
        except ConnectionRefusedError:
            raise DaemonNotRunning(self.socket_path, "connection refused") from None
        except OSError as exc:
            if exc.errno in {errno.ENOTSOCK, errno.ECONNREFUSED, errno.ENOENT}:
                raise DaemonNotRunning(self.socket_path, exc.strerror or str(exc)) from None
            raise
        # Direct mode: a request goes straight to the socket; concurrent callers never
        # interleave frames (the writer serialises whatever the kernel does not take at once).
        self._writer = FrameWriter(self._stream)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._reader, self._stream)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        assert self._tg is not None
        # The reader stops before its socket closes: a read waiting on a descriptor that is
        # closed under it could leave that number registered with the event loop, and the next
        # socket to get it would find the registration taken (`FrameReader`).
        self._tg.cancel_scope.cancel()
        # The reader task handles its own errors; the body's exception (if any) propagates
        # unwrapped instead of inside an exception group.
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            if self._stream is not None:
                await self._stream.aclose()
        return None

    async def _reader(self, stream: anyio.abc.SocketStream) -> None:
        reader = FrameReader(stream, max_bytes=self._max_frame_bytes)
        try:
            while True:
                frame = await reader.read()
                req_id = frame.get("id")
                slot = self._waiting.pop(req_id, None) if isinstance(req_id, int) else None
                if slot is not None:
                    slot[1].append(frame)
                    slot[0].set()
        except (
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            FrameError,
        ):
            pass
        finally:
            self._closed = True
            for event, _ in self._waiting.values():
                event.set()
            self._waiting.clear()

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        """Send one request; return its ``result`` or raise `ControlClientError`."""
        if self._writer is None or self._closed:
            raise ConnectionLost(f"the connection to {self.socket_path} is closed")
        req_id = next(self._ids)
        event = anyio.Event()
        box: list[dict[str, Any]] = []
        self._waiting[req_id] = (event, box)
        try:
            await self._writer.send(encode_frame({"id": req_id, "op": op, "params": params}))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._waiting.pop(req_id, None)
            raise ConnectionLost(f"the daemon at {self.socket_path} closed the connection") from exc
        try:
            await event.wait()
        finally:
            self._waiting.pop(req_id, None)
        if not box:
            raise ConnectionLost(f"the daemon at {self.socket_path} closed the connection")
        response = box[0]
        if response.get("ok") is True:
            result = response.get("result")
            return result if isinstance(result, dict) else {"value": result}
        error = response.get("error")
        raise ControlClientError(op, error if isinstance(error, dict) else {"code": "unknown"})


async def call_once(socket_path: Path, op: str, **params: Any) -> dict[str, Any]:
    """Open a connection, make one request, close it."""
    async with ControlClient(socket_path) as client:
        return await client.call(op, **params)


async def wait_for_daemon(socket_path: Path, *, timeout_s: float = 10.0) -> None:
    """Wait until a daemon answers ``ping`` on *socket_path* (used by the demo and tests)."""
    with anyio.fail_after(timeout_s):
        while True:
            with contextlib.suppress(DaemonNotRunning, ConnectionLost):
                await call_once(socket_path, "ping")
                return
            await anyio.sleep(0.05)
