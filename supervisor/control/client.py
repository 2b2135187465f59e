"""Client of the control API (``control.sock``), used by the `hunter` command, the demo and tests.

`ControlClient` is an async context manager holding one connection; `call` may be used by many
tasks at once (requests are pipelined and matched by id), and `subscribe` follows the daemon's
change feed on the same connection (``events.subscribe``: pushed frames, see
docs/control-protocol.md). `socket_for_root` says where the
daemon for a root listens; `DaemonNotRunning` says clearly which socket was tried and how to
start a daemon.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

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
    "Subscription",
    "socket_for_root",
]

#: events a subscription holds for its reader before it gives up on it (the reader is too slow)
_SUBSCRIPTION_BUFFER: Final = 65_536


class Subscription:
    """The events of one ``events.subscribe``, as an async iterator of event dicts.

    ``ack`` is the daemon's answer (``cursor``, ``gap``, ``replayed``); ``last`` the cursor of
    the newest event read, from which a new subscription resumes (``after=``) without losing
    or repeating an event. Iteration ends with `ControlClientError` when the daemon cut the
    subscription off (``subscriber_too_slow``) and `ConnectionLost` when the connection ends.
    """

    def __init__(self, ack: dict[str, Any], receive: MemoryObjectReceiveStream[dict[str, Any]]):
        self.ack = ack
        self.last: str = str(ack.get("cursor", ""))
        self._receive = receive
        #: the frame that ended the subscription, held back by `batch` behind its events
        self._error: dict[str, Any] | None = None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            frame = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise self._ended() from None
        return self._event(frame)

    async def batch(self) -> list[dict[str, Any]]:
        """Every event that has arrived, at least one (waiting for it): for a reader that
        keeps up with a busy daemon, one wake-up per burst instead of one per event. Ends as
        the iterator does; an error after some events is raised at the next call."""
        try:
            frames = [await self._receive.receive()]
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise self._ended() from None
        while len(frames) < _SUBSCRIPTION_BUFFER:
            try:
                frame = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if "event" not in frame:  # the error that ends it: after what came before
                self._error = frame
                break
            frames.append(frame)
        return [self._event(frame) for frame in frames]

    def _ended(self) -> Exception:
        if self._error is not None:
            error, self._error = self._error, None
            return self._failure(error)
        return ConnectionLost(
            "the subscription ended (the connection closed, or this reader fell"
            f" {_SUBSCRIPTION_BUFFER} events behind); subscribe again with after={self.last!r}"
        )

    def _failure(self, frame: dict[str, Any]) -> ControlClientError:
        error = frame.get("error")
        return ControlClientError(
            "events.subscribe", error if isinstance(error, dict) else {"code": "unknown"}
        )

    def _event(self, frame: dict[str, Any]) -> dict[str, Any]:
        event = frame.get("event")
        if isinstance(event, dict):
            self.last = str(event.get("cursor", self.last))
            return event
        raise self._failure(frame)


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
        #: subscriptions by the id of their request: where their pushed frames go
        self._feeds: dict[int, MemoryObjectSendStream[dict[str, Any]]] = {}
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

    @property
    def closed(self) -> bool:
        """The connection ended (the daemon closed it, or this client did)."""
        return self._closed

    async def _reader(self, stream: anyio.abc.SocketStream) -> None:
        reader = FrameReader(stream, max_bytes=self._max_frame_bytes)
        try:
            while True:
                frame = await reader.read()
                req_id = frame.get("id")
                if (
                    isinstance(req_id, int)
                    and req_id in self._feeds
                    and req_id not in self._waiting
                ):
                    self._push(req_id, frame)
                    continue
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
            for feed in self._feeds.values():
                feed.close()
            self._feeds.clear()

    def _push(self, req_id: int, frame: dict[str, Any]) -> None:
        """A pushed frame of a subscription: an event, or the error that ends it."""
        feed = self._feeds[req_id]
        final = "event" not in frame
        try:
            feed.send_nowait(frame)
        except anyio.WouldBlock:  # the subscription's reader fell this far behind: end it
            final = True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            final = True
        if final:
            self._feeds.pop(req_id, None)
            feed.close()

    @asynccontextmanager
    async def subscribe(self, **params: Any) -> AsyncIterator[Subscription]:
        """Follow the daemon's change feed (``events.subscribe`` with *params*: ``sessions``,
        ``turns``, ``kinds``, ``after``) until the block ends::

            async with client.subscribe(turns=[12]) as events:
                async for event in events:
                    ...
        """
        if self._writer is None or self._closed:
            raise ConnectionLost(f"the connection to {self.socket_path} is closed")
        req_id = next(self._ids)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](_SUBSCRIPTION_BUFFER)
        event = anyio.Event()
        box: list[dict[str, Any]] = []
        self._feeds[req_id] = send
        self._waiting[req_id] = (event, box)
        try:
            await self._writer.send(
                encode_frame({"id": req_id, "op": "events.subscribe", "params": params})
            )
            await event.wait()
            if not box:
                raise ConnectionLost(f"the daemon at {self.socket_path} closed the connection")
            answer = box[0]
            if answer.get("ok") is not True:
                error = answer.get("error")
                raise ControlClientError(
                    "events.subscribe", error if isinstance(error, dict) else {"code": "unknown"}
                )
            result = answer.get("result")
            yield Subscription(result if isinstance(result, dict) else {}, receive)
        finally:
            self._waiting.pop(req_id, None)
            receive.close()
            live = self._feeds.pop(req_id, None)
            if live is not None:
                live.close()
                if not self._closed:  # the daemon ends it too when the connection closes
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(1.0),
                        contextlib.suppress(ControlClientError, ConnectionLost),
                    ):
                        await self.call("events.unsubscribe", subscription=req_id)

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
