"""Signing in and out. The sign-in form carries a token that must match a cookie set with it
(a form posted from another site cannot sign a browser in as someone else); failed attempts
are limited per client address and per name (`supervisor.console.signins.SignInLimit`), and a
name that is no operator costs the same password check as one that is.
"""

from __future__ import annotations

import secrets
import time
from typing import Final

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from supervisor.console.guard import (
    COOKIE,
    FormRefused,
    read_form,
    refusal,
    safe_next,
    set_cookie,
    state_of,
)
from supervisor.console.operators import hash_password, verify_password
from supervisor.console.render import page
from supervisor.logging import get_logger

__all__ = ["ROUTES"]

_PRE: Final = "hunter_console_form"
_LOG: Final = get_logger("supervisor.console")
#: checked when the name is no operator's, so that it costs as much as a real check
_DECOY: Final = hash_password("not a password of anyone", salt=b"hunter-console-decoy")


async def login_form(request: Request, *, message: str = "", status: int = 200) -> Response:
    if state_of(request).settings.user_header is not None:
        return PlainTextResponse("this console signs people in through its proxy", 404)
    token = secrets.token_urlsafe(24)
    response = page(
        request,
        "login.html",
        status,
        form_token=token,
        next=safe_next(request.query_params.get("next")),
        message=message,
    )
    response.set_cookie(_PRE, token, httponly=True, samesite="strict", path="/login")
    return response


async def login(request: Request) -> Response:
    state = state_of(request)
    if state.settings.user_header is not None:
        return PlainTextResponse("this console signs people in through its proxy", 404)
    try:
        form = await read_form(request)
    except FormRefused as exc:
        return refusal(exc)
    expected = request.cookies.get(_PRE, "")
    if not expected or not secrets.compare_digest(expected, form.get("form_token", "")):
        return await login_form(request, message="The form expired; sign in again.", status=403)
    name = form.get("name", "")[:64]
    address = request.client.host if request.client is not None else "local"
    keys = (f"address:{address}", f"name:{name}")
    now = time.monotonic()
    wait = state.limit.retry_after(keys, now)
    if wait > 0:
        _LOG.warning("console_signin_limited", name=name, address=address)
        response = await login_form(
            request,
            message=f"Too many failed sign-ins; try again in {wait:.0f} s.",
            status=429,
        )
        response.headers["retry-after"] = str(int(wait) + 1)
        return response
    operator = state.settings.operators.get(name)
    encoded = operator.password_hash if operator is not None else None
    password = form.get("password", "")[:1024]
    async with state.checks:
        ok = await anyio.to_thread.run_sync(verify_password, password, encoded or _DECOY)
    if operator is None or encoded is None or not ok:
        state.limit.failed(keys, now)
        _LOG.warning("console_signin_failed", name=name, address=address)
        return await login_form(request, message="Wrong name or password.", status=401)
    token, _signin = state.signins.begin(operator.name, operator.role, now)
    _LOG.info("console_signed_in", operator=operator.name, role=operator.role.value)
    response = RedirectResponse(safe_next(form.get("next")), status_code=303)
    set_cookie(request, response, token)
    response.delete_cookie(_PRE, path="/login")
    return response


async def logout(request: Request) -> Response:
    state = state_of(request)
    token = request.cookies.get(COOKIE)
    signin = state.signins.find(token, time.monotonic())
    try:
        form = await read_form(request)
    except FormRefused as exc:
        return refusal(exc)
    if signin is not None and signin.csrf_ok(form.get("csrf")):
        state.signins.end(token)
        _LOG.info("console_signed_out", operator=signin.operator)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


ROUTES: Final = (
    ("/login", login_form, ["GET"]),
    ("/login", login, ["POST"]),
    ("/logout", logout, ["POST"]),
)
