"""The event subscriptions of one control connection (``events.subscribe``, pushed frames).

A subscription is answered at once (``{"id", "ok": true, "result": {"cursor", "gap",
"replayed"}}``), then pushed one frame per event, ``{"id": <the subscribe request's id>,
"event": {...}}``, until the client ends it (``events.unsubscribe``, or closing the
connection) or it is cut off: a client that stops reading while its connection holds 1 MiB of
unread frames (`MAX_UNREAD_BYTES`, the most the daemon keeps for it) gets one last frame,
``{"id", "ok": false, "error": {"code": "subscriber_too_slow", "message", "resume_after"}}``,
and nothing more (`supervisor.feed`). No task runs per subscription: the feed's publish hands
each event to the connection's writer without waiting.
"""

from __future__ import annotations

from typing import Final

import orjson

from supervisor.errors import RequestError
from supervisor.feed import Event, EventFilter, Feed, Subscriber
from supervisor.logging import get_logger
from supervisor.wire.control import EventsSubscribe, EventsUnsubscribe, RequestId
from supervisor.wire.frames import FrameWriter, encode_frame, frame_of

__all__ = ["MAX_SUBSCRIPTIONS", "Subscriptions"]

#: subscriptions one connection may hold at once
MAX_SUBSCRIPTIONS: Final = 64
#: unread bytes a connection may hold for its subscriptions before they are cut off (the
#: writer's own limit, 4 MiB, is for answers): 100 stalled subscribers cost at most 100 MiB
MAX_UNREAD_BYTES: Final = 1024 * 1024

_EVENT: Final = b',"event":'
_log = get_logger("supervisor.control.subscriptions")


class Subscriptions:
    """The subscriptions of one connection, by the id of the request that began each."""

    __slots__ = ("_feed", "_open", "_writer")

    def __init__(self, feed: Feed, writer: FrameWriter) -> None:
        self._feed = feed
        self._writer = writer
        self._open: dict[RequestId, Subscriber] = {}

    def handle(self, request: EventsSubscribe | EventsUnsubscribe) -> None:
        """Serve a subscribe or unsubscribe request: its answer is queued on the writer."""
        try:
            if isinstance(request, EventsSubscribe):
                self._subscribe(request)
            else:
                self._unsubscribe(request)
        except RequestError as exc:
            self._send({"id": request.id, "ok": False, "error": exc.to_wire()})

    def close(self) -> None:
        """The connection ends: every subscription of it with it."""
        subs, self._open = self._open, {}
        for sub in subs.values():
            self._feed.unsubscribe(sub)

    def __len__(self) -> int:
        return len(self._open)

    def _subscribe(self, request: EventsSubscribe) -> None:
        rid = request.id
        if rid in self._open:
            raise RequestError(
                "bad_request",
                f"events.subscribe: request id {rid!r} already names a subscription on this"
                " connection; give each subscription its own id",
                field="id",
            )
        if len(self._open) >= MAX_SUBSCRIPTIONS:
            raise RequestError(
                "busy",
                f"events.subscribe: this connection holds {MAX_SUBSCRIPTIONS} subscriptions;"
                " end one (events.unsubscribe) or widen a filter instead",
            )
        params = request.params
        try:
            event_filter = EventFilter(
                sessions=params.sessions, turns=params.turns, kinds=params.kinds
            )
        except ValueError as exc:
            raise RequestError("bad_request", f"events.subscribe: {exc}", field="kinds") from None
        head = b'{"id":' + orjson.dumps(rid)
        writer = self._writer

        def deliver(_event: Event, body: bytes) -> bool:
            if writer.queued > MAX_UNREAD_BYTES:
                return False
            return writer.send_nowait(frame_of(head, _EVENT, body, b"}"), cork=True)

        sub = Subscriber(event_filter, deliver, lambda reason: self._cut(rid, reason))
        try:
            replay = self._feed.subscribe(sub, after=params.after)
        except ValueError as exc:
            raise RequestError("bad_request", f"events.subscribe: {exc}", field="after") from None
        self._open[rid] = sub
        self._send(
            {
                "id": rid,
                "ok": True,
                "result": {
                    "subscribed": True,
                    "cursor": replay.cursor,
                    "gap": replay.gap,
                    "replayed": len(replay.events),
                },
            }
        )
        for event in replay.events:  # before any live event: no await in between
            sub.offer(event, self._feed.encode(event))

    def _unsubscribe(self, request: EventsUnsubscribe) -> None:
        sub = self._open.pop(request.params.subscription, None)
        if sub is None:
            raise RequestError(
                "bad_request",
                f"events.unsubscribe: no subscription {request.params.subscription!r} on this"
                " connection",
                field="subscription",
            )
        self._feed.unsubscribe(sub)
        self._send({"id": request.id, "ok": True, "result": {"unsubscribed": True}})

    def _cut(self, rid: RequestId, reason: str) -> None:
        sub = self._open.pop(rid, None)
        if sub is None:
            return
        self._feed.unsubscribe(sub)
        self._feed.cut_off += 1
        cursor = sub.last
        _log.warning("events_subscriber_cut", subscription=rid, reason=reason, resume_after=cursor)
        self._writer.send_nowait(
            encode_frame(
                {
                    "id": rid,
                    "ok": False,
                    "error": {
                        "code": "subscriber_too_slow",
                        "message": f"events.subscribe: {reason}",
                        "resume_after": cursor,
                    },
                }
            ),
            cork=True,
            last=True,
        )

    def _send(self, answer: dict[str, object]) -> None:
        self._writer.send_nowait(encode_frame(answer), cork=False, last=True)
