"""Pages from templates: Jinja2 with autoescaping on for every template (a turn's stdout or a
selector holding ``<script>`` is shown as text), an absent field shown as nothing, and the
filters the
templates use to show times, durations and hashes.

A page asked for with the header ``X-Console-Partial: main`` (what console.js sends when an
event says the page changed) is answered with its ``main`` block only.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Final

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from supervisor.console.cookie import set_cookie

__all__ = ["ENV", "page"]

ENV: Final = jinja2.Environment(
    loader=jinja2.PackageLoader("supervisor.console", "templates"),
    autoescape=True,
    # the daemon's answers have optional fields (docs/control-protocol.md): one that is absent
    # shows as nothing, never as an error page
    undefined=jinja2.ChainableUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(us: int | None) -> str:
    if not us:
        return ""
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _ago(us: int | None) -> str:
    if not us:
        return ""
    seconds = max(0.0, time.time() - us / 1e6)
    if seconds < 60:
        return f"{seconds:.1f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _ms(value: object) -> str:
    if not isinstance(value, int | float):
        return ""
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    return f"{value:,.0f} ms"


def _short(value: object, n: int = 12) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= n else text[:n] + "…"


ENV.filters.update(when=_when, ago=_ago, ms=_ms, short=_short)


def page(request: Request, name: str, status_code: int = 200, **context: object) -> HTMLResponse:
    """Render template *name* with *context* (and the request, the sign-in, the CSRF token)."""
    template = ENV.get_template(name)
    signin = getattr(request.state, "signin", None)
    values = {
        "request": request,
        "signin": signin,
        "csrf": signin.csrf if signin is not None else "",
        "follow": "",
        "problem": None,
        **context,
    }
    if request.headers.get("x-console-partial") == "main" and "main" in template.blocks:
        ctx = template.new_context(values)
        body = "".join(template.blocks["main"](ctx))
    else:
        body = template.render(values)
    response = HTMLResponse(body, status_code=status_code)
    token = getattr(request.state, "new_token", None)
    if token is not None:
        set_cookie(request, response, token)
    return response
