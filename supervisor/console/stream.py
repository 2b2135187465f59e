"""``GET /events``: tells a page, live, that what it shows changed (Server-Sent Events).

Each browser's stream waits on the group its page follows (`LiveFeed.listen`: ``?turn=N``,
``?session=S``, or everything) and sends one message, ``{"changes", "cursor", "kind"}`` (how
many changes since its last message, the newest one's cursor and kind), when that group's
generation has moved, at most `MESSAGES_PER_S` a second: the page then re-reads itself. So a
browser costs the console a few small writes a second however busy the daemon is, and one that
stops reading holds only its place. A comment line every `KEEPALIVE_S` keeps proxies from
closing a quiet stream and ends it once its sign-in has expired.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Final

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from supervisor.console import ids
from supervisor.console.errors import BadId
from supervisor.console.guard import COOKIE, authenticate, state_of
from supervisor.console.live import MAX_STREAMS, TooManyStreams

__all__ = ["MESSAGES_PER_S", "ROUTES"]

KEEPALIVE_S: Final = 15.0
#: messages a stream sends at most per second (a page re-reads itself at most this often)
MESSAGES_PER_S: Final = 4


async def events(request: Request) -> Response:
    signin = authenticate(request)
    if isinstance(signin, Response):
        return signin
    turn_text = request.query_params.get("turn")
    session_text = request.query_params.get("session")
    try:
        turn = None if turn_text is None else ids.turn_id(turn_text, field="turn", in_path=False)
        session = (
            None
            if session_text is None
            else ids.session_id(session_text, field="session", in_path=False)
        )
    except BadId as exc:
        return PlainTextResponse(f"{exc.field}: {exc}", 400)
    state = state_of(request)
    token = request.cookies.get(COOKIE)
    feed = state.feed
    if feed.streams >= MAX_STREAMS:
        return PlainTextResponse("too many live streams are open; try again later", 503)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async with feed.listen(turn=turn, session=session) as follow:
                seen = follow.generation
                yield b": live\n\n"
                while True:
                    with anyio.move_on_after(KEEPALIVE_S) as quiet:
                        await follow.wait_past(seen)
                    if quiet.cancelled_caught:
                        if token and state.signins.find(token, time.monotonic()) is None:
                            return  # signed out or expired: the page goes to the sign-in
                        yield b": keepalive\n\n"
                        continue
                    message = {
                        "changes": follow.generation - seen,
                        "cursor": follow.cursor,
                        "kind": follow.kind,
                    }
                    seen = follow.generation
                    yield b"data: " + orjson.dumps(message) + b"\n\n"
                    await anyio.sleep(1 / MESSAGES_PER_S)  # what comes meanwhile: one message
        except TooManyStreams:
            return

    return StreamingResponse(
        lines(),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


ROUTES: Final = (("/events", events),)
