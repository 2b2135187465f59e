"""The console's ASGI application: Starlette routes over the pages, the decisions, signing in
and the live stream, behind `HostCheck` (a request must name this console) and
`SecurityHeaders`. `build_app` is what `hunter console` serves (`supervisor.console.server`)
and what the tests drive.

Every redirect is a path (``Location: /turns/7``), never a URL built from the request's
``Host``: Starlette's own trailing-slash redirect is off, and `elsewhere` does it instead."""

from __future__ import annotations

from importlib.resources import files
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketClose

from supervisor.console import actions, pages, signin_pages, stream
from supervisor.console.guard import HostCheck, SecurityHeaders, state_of
from supervisor.console.refusals import NOT_FOUND
from supervisor.console.state import ConsoleState

__all__ = ["build_app"]


async def healthz(request: Request) -> Response:
    """For probes, without a sign-in: whether the console reaches the daemon (200) or not (503);
    nothing else is told."""
    up = state_of(request).link.client is not None
    return JSONResponse({"daemon": "up" if up else "down"}, status_code=200 if up else 503)


def _routed(routes: list[BaseRoute], scope: Scope, path: str) -> bool:
    target = {**scope, "path": path}
    return any(route.matches(target)[0] is not Match.NONE for route in routes)


async def elsewhere(scope: Scope, receive: Receive, send: Send) -> None:
    """What a path with no route gets: one that names a page but for its trailing slashes
    goes there (307, to a path of ours: the same path without the slashes, the same query),
    anything else the console's own 404 page."""
    if scope["type"] != "http":
        await WebSocketClose()(scope, receive, send)
        return
    path = str(scope["path"])
    bare = path.rstrip("/")
    if (
        bare != path
        and bare.startswith("/")
        and not bare.startswith("//")  # a Location of //host is another site
        and "\\" not in bare
        and _routed(scope["router"].routes, scope, bare)
    ):
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        location = quote(bare, safe="/") + (f"?{query}" if query else "")
        response: Response = RedirectResponse(location, 307)
    else:
        response = NOT_FOUND.page(Request(scope))
    await response(scope, receive, send)


def build_app(state: ConsoleState) -> Starlette:
    static = StaticFiles(directory=str(files("supervisor.console") / "static"))
    routes = [
        *(Route(path, handler, methods=["GET"]) for path, handler in pages.ROUTES),
        *(Route(path, handler, methods=["POST"]) for path, handler in actions.ROUTES),
        *(Route(path, handler, methods=methods) for path, handler, methods in signin_pages.ROUTES),
        *(Route(path, handler, methods=["GET"]) for path, handler in stream.ROUTES),
        Route("/healthz", healthz, methods=["GET"]),
        Mount("/static", app=static, name="static"),
    ]
    app = Starlette(routes=routes)
    app.router.redirect_slashes = False  # its redirect is an absolute URL from the Host header
    app.router.default = elsewhere
    app.state.console = state
    app.add_middleware(HostCheck, hosts=state.hosts)
    app.add_middleware(SecurityHeaders)  # the outer one: its headers on HostCheck's 400 too
    return app
