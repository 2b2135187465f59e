"""What stands between a browser and the daemon: which names the console answers to (the
``Host`` header, `supervisor.console.hosts`), who is signed in (the cookie, or the proxy's user
header), what a POST must carry (the sign-in's CSRF token, a same-origin ``Origin``, a
url-encoded form), how big a form may be, and the headers every answer has (a strict
Content-Security-Policy among them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from supervisor.console.cookie import COOKIE, set_cookie, state_of
from supervisor.console.hosts import AllowedHosts
from supervisor.console.render import page
from supervisor.console.signins import SignIn
from supervisor.console.state import ConsoleState

__all__ = [
    "COOKIE",
    "FORM_TYPE",
    "FormRefused",
    "FormTooLarge",
    "HostCheck",
    "NotAForm",
    "SecurityHeaders",
    "authenticate",
    "post_refused",
    "read_form",
    "refusal",
    "safe_next",
    "set_cookie",
    "state_of",
]

#: a form is a few short fields; more than this is refused before it is read
MAX_FORM_BYTES: Final = 16 * 1024
#: what every form of ours sends (none has a file, so none is multipart)
FORM_TYPE: Final = "application/x-www-form-urlencoded"

#: No script but our own file, no inline style or script, no frames, no plugins, forms only to
#: ourselves: a `<script>` that slipped into a page could not run.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # not no-referrer: with it a browser sends "Origin: null" on our own form posts
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
)


class FormRefused(Exception):
    """Raised by `read_form` for a body that is none of our forms; ``status`` is the answer's
    code and the message says why (`refusal` makes the answer)."""

    status: int = 400


class FormTooLarge(FormRefused):
    """Raised by `read_form` for a body over `MAX_FORM_BYTES` (413)."""

    status = 413

    def __init__(self, message: str = "request body too large") -> None:
        super().__init__(message)


class NotAForm(FormRefused):
    """Raised by `read_form` for a body that is not `FORM_TYPE` (415): a script's
    ``text/plain`` or JSON body is never taken for a form, whatever it holds."""

    status = 415


def refusal(exc: FormRefused) -> Response:
    """The answer to a body `read_form` refused."""
    return PlainTextResponse(str(exc), exc.status)


class HostCheck:
    """ASGI middleware: a request whose ``Host`` header does not name this console
    (`AllowedHosts`) is answered 400 with the console's error page, before anything else
    reads it; so nothing the console builds (an ``Origin`` to compare) comes from another
    name."""

    def __init__(self, app: ASGIApp, *, hosts: AllowedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = [value for name, value in scope["headers"] if name == b"host"]
        host = given[0].decode("latin-1") if len(given) == 1 else None
        if len(given) > 1 or not self.hosts.permits(host):
            shown = "no name" if host is None else repr(host[:100])
            refused = page(
                Request(scope),
                "error.html",
                400,
                title="unknown host",
                message=f"This console does not answer to {shown}. Open it by the address it"
                " listens on, or by a name given to it with --allow-host.",
            )
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


class SecurityHeaders:
    """ASGI middleware: the headers above on every answer, ``Cache-Control: no-store`` on all
    but the static files, and bodies over `MAX_FORM_BYTES` refused (413) by their length."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > MAX_FORM_BYTES):
                await PlainTextResponse("request body too large", 413)(scope, receive, send)
                return
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.extend(_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def authenticate(request: Request) -> SignIn | Response:
    """The request's sign-in, or the answer to send instead: to the sign-in page (a GET), 401
    (anything else), 403 (a proxy's user who is not an operator)."""
    state = state_of(request)
    now = time.monotonic()
    token = request.cookies.get(COOKIE)
    signin = state.signins.find(token, now)
    header = state.settings.user_header
    if header is not None:
        return _by_proxy(request, state, header, signin, now)
    if signin is not None:
        return signin
    if request.method == "GET" and not request.url.path.startswith("/events"):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={_quote(target)}", status_code=303)
    return PlainTextResponse("sign in first (/login)", status_code=401)


def _by_proxy(
    request: Request, state: ConsoleState, header: str, signin: SignIn | None, now: float
) -> SignIn | Response:
    user = request.headers.get(header)
    if not user:
        return PlainTextResponse(
            f"the proxy sent no {header} header: the console serves only people the proxy"
            " signed in",
            status_code=401,
        )
    if signin is not None and signin.operator == user:
        return signin
    operator = state.settings.operators.get(user)
    if operator is None:
        return PlainTextResponse(
            f"{user!r} is not an operator of this console (add them to the operators file)",
            status_code=403,
        )
    token, fresh = state.signins.begin(operator.name, operator.role, now, by_proxy=True)
    request.state.new_token = token  # the handler's answer sets the cookie (`set_cookie`)
    return fresh


def post_refused(request: Request, signin: SignIn, form: Mapping[str, str]) -> Response | None:
    """Why this state-changing request is refused (403), or None: it must come from one of our
    own pages (``Origin``, when the browser sends it, is ours) and carry the sign-in's CSRF
    token."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin != own:
            return PlainTextResponse(
                f"refused: the request came from {origin}, not from this console", 403
            )
    elif origin == "null":
        return PlainTextResponse("refused: the request came from an opaque origin", 403)
    if not signin.csrf_ok(form.get("csrf")):
        return PlainTextResponse(
            "refused: the form's CSRF token is missing or wrong (reload the page and try again)",
            403,
        )
    return None


async def read_form(request: Request) -> dict[str, str]:
    """The url-encoded form of a POST: `NotAForm` for another content type, `FormTooLarge`
    past `MAX_FORM_BYTES`; a field given twice keeps its first value."""
    given = request.headers.get("content-type", "")
    form = given.partition(";")[0].strip().lower() == FORM_TYPE
    body = bytearray()
    # read even a body we refuse (at most MAX_FORM_BYTES): the connection then stays usable and
    # the client reads our answer, instead of a reset while it is still sending
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORM_BYTES:
            break
    if not form:
        shown = repr(given[:100]) if given else "no content type"
        raise NotAForm(f"refused: the body is {shown}, not a form of this console ({FORM_TYPE})")
    if len(body) > MAX_FORM_BYTES:
        raise FormTooLarge
    text = body.decode("utf-8", errors="replace")
    try:
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=20)
    except ValueError:  # more fields than any form of ours has
        raise FormTooLarge("too many form fields") from None
    return {k: v[0] for k, v in fields.items()}


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of ours only (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
