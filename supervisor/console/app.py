"""The console's ASGI application: Starlette routes over the pages, the decisions, signing in
and the live stream, behind `SecurityHeaders`. `build_app` is what `hunter console` serves
(`supervisor.console.server`) and what the tests drive."""

from __future__ import annotations

from importlib.resources import files

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from supervisor.console import actions, pages, signin_pages, stream
from supervisor.console.guard import SecurityHeaders, state_of
from supervisor.console.state import ConsoleState

__all__ = ["build_app"]


async def healthz(request: Request) -> Response:
    """For probes, without a sign-in: whether the console reaches the daemon (200) or not (503);
    nothing else is told."""
    up = state_of(request).link.client is not None
    return JSONResponse({"daemon": "up" if up else "down"}, status_code=200 if up else 503)


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
    app.state.console = state
    app.add_middleware(SecurityHeaders)
    return app
