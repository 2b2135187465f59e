"""``GET /events``: the live changes a page follows, as Server-Sent Events.

Each browser's stream is one listener on the console's `LiveFeed` (the daemon sees one
subscriber however many browsers follow it), filtered to what the page shows (``?turn=N``,
``?session=S``, or everything). A comment line every `KEEPALIVE_S` keeps proxies from closing
a quiet stream and ends it once its sign-in has expired. A browser that falls behind has its
stream closed; its page reconnects and re-reads.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from supervisor.console.guard import COOKIE, authenticate, state_of
from supervisor.console.live import TooManyStreams
from supervisor.feed import Event

__all__ = ["ROUTES"]

KEEPALIVE_S: Final = 15.0
_ENCODE: Final = msgspec.json.Encoder()


def _wants(request: Request) -> Callable[[Event], bool] | Response:
    turn = request.query_params.get("turn")
    session = request.query_params.get("session")
    if turn is not None:
        if not turn.isdigit() or len(turn) > 19:
            return PlainTextResponse("turn: must be a turn id", 400)
        turn_id = int(turn)
        return lambda e: e.turn_id == turn_id or e.kind == "console.resync"
    if session is not None:
        return lambda e: e.session_id == session or e.kind == "console.resync"
    return lambda e: True


async def events(request: Request) -> Response:
    signin = authenticate(request)
    if isinstance(signin, Response):
        return signin
    wants = _wants(request)
    if isinstance(wants, Response):
        return wants
    state = state_of(request)
    token = request.cookies.get(COOKIE)
    feed = state.feed
    if feed.streams >= 1000:
        return PlainTextResponse("too many live streams are open; try again later", 503)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async with feed.listen(wants) as stream:
                yield b": live\n\n"
                while True:
                    with anyio.move_on_after(KEEPALIVE_S) as quiet:
                        event = await stream.receive()
                    if quiet.cancelled_caught:
                        if token and state.signins.find(token, time.monotonic()) is None:
                            return  # signed out or expired: the page goes to the sign-in
                        yield b": keepalive\n\n"
                        continue
                    yield b"data: " + _ENCODE.encode(event) + b"\n\n"
        except (anyio.EndOfStream, anyio.ClosedResourceError, TooManyStreams):
            return  # dropped for falling behind: the browser reconnects

    return StreamingResponse(
        lines(),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


ROUTES: Final = (("/events", events),)
