"""The pages an operator reads: overview, sessions, a session, turns, a turn (its timeline),
escalations, executors, and a turn's evidence bytes. Each reads the daemon through the client
library (`supervisor.client`) over the console's one connection; lists are paged. An id in a
path or a parameter is checked first (`supervisor.console.ids`): one that nothing can have is
404 (in the path) or 400 (a parameter), and the daemon is not asked.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from supervisor.client import Client, ConnectionLost, HunterError
from supervisor.console import ids
from supervisor.console.charts import throughput_svg
from supervisor.console.errors import BadId
from supervisor.console.guard import authenticate, state_of
from supervisor.console.refusals import refusal_page
from supervisor.console.render import page
from supervisor.console.timeline import timeline
from supervisor.wire.turn_spec import requested_by_text

__all__ = ["ROUTES"]

Handler = Callable[[Request, Client], Awaitable[Response]]


def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Run *handler* for a signed-in operator with the daemon's client; answer the sign-in
    page, a "daemon unreachable" page (503) or the daemon's refusal instead where due."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        signin = authenticate(request)
        if isinstance(signin, Response):
            return signin
        request.state.signin = signin
        state = state_of(request)
        client = state.link.client
        if client is None:
            return page(
                request, "unreachable.html", 503, problem=state.link.problem, follow="reconnect"
            )
        try:
            return await handler(request, client)
        except BadId as exc:
            title = "not found" if exc.in_path else "bad request"
            return page(request, "error.html", exc.status, title=title, message=str(exc))
        except HunterError as exc:  # in web words: a missing turn, session, evidence is 404
            return refusal_page(request, exc)
        except ConnectionLost as exc:  # the daemon went away during the request
            problem = f"the daemon at {state.link.socket}: {exc}"
            return page(request, "unreachable.html", 503, problem=problem, follow="reconnect")

    return run


def _int(value: str | None, default: int = 0) -> int:
    """A list's offset (the console's own, never sent to the daemon): garbage is the start."""
    try:
        return max(0, int(value)) if value is not None and len(value) <= 19 else default
    except ValueError:
        return default


@signed_in
async def overview(request: Request, client: Client) -> Response:
    state = state_of(request)
    status = await state.status.get(client.status)
    return page(
        request,
        "overview.html",
        follow="all",
        status=status,
        chart=throughput_svg(state.feed.buckets(time.time())),
        recent=list(state.feed.recent),
        streams=state.feed.streams,
    )


@signed_in
async def sessions(request: Request, client: Client) -> Response:
    size = state_of(request).settings.page_size
    wanted_state = request.query_params.get("state") or None
    package = request.query_params.get("package") or None
    rows = [
        s
        for s in await client.sessions()
        if (wanted_state is None or s.state == wanted_state)
        and (package is None or s.package_id == package)
    ]
    start = _int(request.query_params.get("start"))
    return page(
        request,
        "sessions.html",
        follow="all",
        rows=rows[start : start + size],
        total=len(rows),
        start=start,
        size=size,
        wanted_state=wanted_state or "",
        package=package or "",
    )


@signed_in
async def session(request: Request, client: Client) -> Response:
    session_id = ids.session_id(request.path_params["session_id"])
    after = ids.after_turn(request.query_params.get("after"))
    info = await client.session(session_id)
    size = state_of(request).settings.page_size
    turns = await client.turn_page(after=after, limit=size, session_id=session_id)
    check = await client.verify_ledgers(session_id=session_id)
    return page(
        request,
        "session.html",
        follow=f"session:{session_id}",
        session=info.session,
        package=info.package,
        package_problem=info.package_problem,
        turns=turns.turns,
        after=after,
        next_after=turns.next_after,
        check=check,
    )


@signed_in
async def turns(request: Request, client: Client) -> Response:
    after = ids.after_turn(request.query_params.get("after"))
    found = await client.turn_page(after=after, limit=state_of(request).settings.page_size)
    return page(
        request,
        "turns.html",
        follow="all",
        rows=found.turns,
        after=after,
        next_after=found.next_after,
    )


@signed_in
async def turn(request: Request, client: Client) -> Response:
    turn_id = ids.turn_id(request.path_params["turn_id"])
    record = await client.decision_record(turn_id)
    result = record.turn.result or {}
    spec = record.turn.spec or {}
    return page(
        request,
        "turn.html",
        follow=f"turn:{turn_id}",
        record=record,
        turn=record.turn,
        steps=timeline(record.turn),
        result=result,
        spec=spec,
        requested_by=requested_by_text(spec.get("requested_by")),
        done=request.query_params.get("done", ""),
    )


@signed_in
async def escalations(request: Request, client: Client) -> Response:
    size = state_of(request).settings.page_size
    after = ids.after_turn(request.query_params.get("after"))
    found = await client.escalation_page(after=after, limit=size)
    return page(
        request,
        "escalations.html",
        follow="all",
        rows=found.turns,
        after=after,
        next_after=found.next_after,
        done=request.query_params.get("done", ""),
    )


@signed_in
async def executors(request: Request, client: Client) -> Response:
    size = state_of(request).settings.page_size
    after = ids.after_executor(request.query_params.get("after"))
    found = await client.executor_page(after=after, limit=size)
    return page(
        request,
        "executors.html",
        follow="all",
        rows=found.executors,
        after=after,
        next_after=found.next_after,
        now_us=int(time.time() * 1e6),
    )


@signed_in
async def evidence(request: Request, client: Client) -> Response:
    """The evidence bytes of a turn, as a download, read from the daemon a slice at a time."""
    turn_id = ids.turn_id(request.path_params["turn_id"])
    first = await client.evidence(turn_id)

    async def chunks() -> AsyncIterator[bytes]:
        part = first
        yield part.data
        while part.more and part.data:
            part = await client.evidence(turn_id, offset=part.offset + len(part.data))
            yield part.data

    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={
            "content-disposition": f'attachment; filename="turn-{turn_id}-evidence.bin"',
            "content-length": str(first.size),
            "x-evidence-sha256": str(first.sha256),
        },
    )


ROUTES: Final = (
    ("/", overview),
    ("/sessions", sessions),
    ("/sessions/{session_id}", session),
    ("/turns", turns),
    ("/turns/{turn_id}", turn),
    ("/turns/{turn_id}/evidence", evidence),
    ("/escalations", escalations),
    ("/executors", executors),
)
