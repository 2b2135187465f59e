"""The control API's connections: framing, the error boundary, busy refusals, the peer's
credentials, and which requests get a task. Apart from `supervisor.control.server` (the table
of operations) because it changes with the transport, not with the protocol's operations: it
answers every request through its owner's `Answering.handle`, except the ones it takes without
a task (``events.subscribe``/``events.unsubscribe``: `subscriptions`; instruction submits:
`submits`).

A connection may carry many requests at once: each is served by its own task, so a long
``turn.wait`` does not hold up the others; answers leave in completion order through a corked
writer. A malformed frame closes that connection only; more than ``max_requests`` in progress
get a ``busy`` answer at once; an answer over the frame limit a ``reply_too_large`` one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from supervisor.control.replies import Replies
from supervisor.control.submits import QuickSubmits
from supervisor.control.subscriptions import Subscriptions
from supervisor.executors.peercred import PeerCredentials, stream_peer_credentials
from supervisor.feed import Feed
from supervisor.logging import describe_error, get_logger
from supervisor.stages import stage_costs
from supervisor.wire.control import (
    ControlRequest,
    EventsSubscribe,
    EventsUnsubscribe,
    RequestDecodeError,
    TurnSubmit,
    decode_request,
    op_of,
)
from supervisor.wire.frames import FrameError, FrameReader, FrameTooLarge, FrameWriter, encode_frame

__all__ = ["Answering", "Connections"]

_COSTS: Final = stage_costs()

#: Operations that change state: they finish even if the client disconnects meanwhile
#: (``turn.submit`` shields its own accept-and-schedule step, not its optional wait).
_STATE_CHANGING: Final = frozenset(
    {"session.open", "session.close", "turn.cancel", "escalations.resolve", "drain"}
)


class Answering(Protocol):
    """What a connection needs of its owner: the answer to one request (never raises for bad
    input), its decisions attributed to *peer*."""

    async def handle(
        self,
        request: ControlRequest | RequestDecodeError,
        *,
        peer: PeerCredentials | None = None,
    ) -> dict[str, object]: ...


class Connections:
    """Serves control connections for one *answering* owner. *on_drain*: called once the
    answer to an accepted ``drain`` is on its way (None: the owner refuses drains)."""

    def __init__(
        self,
        answering: Answering,
        *,
        quick: QuickSubmits,
        feed: Feed,
        max_frame_bytes: int,
        max_requests: int,
        on_drain: Callable[[], None] | None,
    ) -> None:
        self._handle = answering.handle  # bound once: looked up per request otherwise
        self._quick = quick
        self._feed = feed
        self._max_frame_bytes = max_frame_bytes
        self._max_requests = max_requests
        self._on_drain = on_drain
        # the control server's events, under its name
        self._log = get_logger("supervisor.control.server")
        self.open = 0  # connections being served
        self.taken = 0  # requests answered here without the owner (subscriptions, quick submits)

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        """One control connection, and its error boundary: whatever happens on it, an exception
        nobody foresaw included, costs this connection only (closed, and logged with the peer's
        uid and pid), never the server or the daemon. Cancellation passes through."""
        self.open += 1
        creds = stream_peer_credentials(stream)
        try:
            await self._serve_connection(stream, creds)
        except Exception as exc:
            self._log.exception(
                "control_connection_failed",
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
                error=describe_error(exc),
            )
            with contextlib.suppress(Exception):
                await stream.aclose()
        finally:
            self.open -= 1

    async def _serve_connection(
        self, stream: anyio.abc.SocketStream, peer: PeerCredentials | None
    ) -> None:
        reader = FrameReader(stream, max_bytes=self._max_frame_bytes)
        # Corked writer: answers completed in the same event-loop pass (a group commit ends
        # many turns at once) leave in one send; a lone answer is written at once.
        writer = FrameWriter(stream)
        in_progress = [0]  # requests of this connection being served by a task
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            replies = Replies(writer, tg, max_frame_bytes=self._max_frame_bytes)
            tg.start_soon(replies.timers.run)
            # Let the writer start before the first request is read: a request already in the
            # socket is read without a wait, and its answer may be handed over without one.
            await anyio.lowlevel.checkpoint()
            subscriptions = Subscriptions(self._feed, writer)
            try:
                await self._read_requests(
                    reader, writer, tg, replies, in_progress, subscriptions=subscriptions, peer=peer
                )
            finally:
                subscriptions.close()
                replies.close()
            # The client went away: nobody will read the answers. Waits and reads in progress
            # are cancelled; requests that change state run to the end (they are shielded).
            tg.cancel_scope.cancel()

    async def _read_requests(
        self,
        reader: FrameReader,
        writer: FrameWriter,
        tg: anyio.abc.TaskGroup,
        replies: Replies,
        in_progress: list[int],
        *,
        subscriptions: Subscriptions,
        peer: PeerCredentials | None,
    ) -> None:
        while True:
            try:
                body = await reader.read_body()
                request: ControlRequest | RequestDecodeError
                started = _COSTS.clock()
                try:
                    request = decode_request(body)
                except RequestDecodeError as exc:
                    request = exc
                _COSTS.add("decode", _COSTS.clock() - started)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
            except FrameError as exc:
                self._log.warning("control_frame_error", reason=exc.reason)
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await writer.send(
                        encode_frame(
                            {
                                "id": None,
                                "ok": False,
                                "error": {
                                    "code": "bad_request",
                                    "message": f"bad frame: {exc.reason}; closing connection",
                                },
                            }
                        ),
                        cork=False,
                    )
                    await writer.flush()
                break
            if in_progress[0] + replies.owed >= self._max_requests:
                await self._refuse_busy(writer, request)
                continue
            if isinstance(request, EventsSubscribe | EventsUnsubscribe):
                self.taken += 1
                subscriptions.handle(request)  # answered at once; events follow by callback
                continue
            if isinstance(request, TurnSubmit) and self._quick.take(replies, request):
                self.taken += 1
                continue  # taken without a task: its answer comes from a callback
            in_progress[0] += 1
            tg.start_soon(self._serve_counted, writer, request, in_progress, peer)

    async def _serve_counted(
        self,
        writer: FrameWriter,
        request: ControlRequest | RequestDecodeError,
        in_progress: list[int],
        peer: PeerCredentials | None,
    ) -> None:
        try:
            await self._serve_request(writer, request, peer)
        finally:
            in_progress[0] -= 1

    async def _refuse_busy(
        self, writer: FrameWriter, request: ControlRequest | RequestDecodeError
    ) -> None:
        request_id = request.request_id if isinstance(request, RequestDecodeError) else request.id
        self._log.warning("control_connection_busy", limit=self._max_requests)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(
                encode_frame(
                    {
                        "id": request_id,
                        "ok": False,
                        "error": {
                            "code": "busy",
                            "message": (
                                f"this connection already has {self._max_requests} requests in"
                                " progress; wait for answers or open another connection"
                            ),
                            "retry_after_ms": 100,
                        },
                    }
                )
            )

    async def _serve_request(
        self,
        writer: FrameWriter,
        request: ControlRequest | RequestDecodeError,
        peer: PeerCredentials | None = None,
    ) -> None:
        op = None if isinstance(request, RequestDecodeError) else op_of(request)
        if op in _STATE_CHANGING:
            with anyio.CancelScope(shield=True):
                response = await self._handle(request, peer=peer)
        else:
            response = await self._handle(request, peer=peer)
        draining = op == "drain" and response["ok"] and self._on_drain is not None
        started = _COSTS.clock()
        try:
            frame = encode_frame(response, max_bytes=self._max_frame_bytes)
            _COSTS.add("reply", _COSTS.clock() - started)
        except FrameTooLarge as exc:  # the client would refuse it: say so, keep the connection
            self._log.warning("control_reply_too_large", op=op, size=exc.size)
            frame = encode_frame(
                {
                    "id": response.get("id"),
                    "ok": False,
                    "error": {
                        "code": "reply_too_large",
                        "message": (
                            f"the answer to {op} is {exc.size} bytes, over the"
                            f" {exc.max_bytes}-byte frame limit; ask for less (a session, a"
                            " smaller limit)"
                        ),
                    },
                }
            )
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(frame, cork=False if draining else None)
            if draining:
                await writer.flush()
        if draining and self._on_drain is not None:
            self._on_drain()  # after the answer is on its way: the drain may close this stream
