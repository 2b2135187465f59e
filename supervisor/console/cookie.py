"""The console's sign-in cookie and where a request finds the console's state.

Apart from `guard` (which checks the cookie on every request) so that `render` can set a new
one on the page it answers, without the two importing each other.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from supervisor.console.state import ConsoleState

__all__ = ["COOKIE", "set_cookie", "state_of"]

COOKIE: Final = "supervisor.console"


def state_of(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


def set_cookie(request: Request, response: Response, token: str) -> None:
    """The sign-in cookie: HttpOnly, SameSite=Strict, Secure over TLS (or when configured)."""
    secure = state_of(request).settings.secure_cookies
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https" if secure is None else secure,
        path="/",
    )
