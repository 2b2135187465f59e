"""`hunter mcp --http`: streamable HTTP on a Unix socket or a loopback port, for hosts that
connect to a running server. Every request must carry ``Authorization: Bearer <token>``, the
token read from a file (compared in constant time); the MCP endpoint is ``/mcp``. Served by
hypercorn (as the console is) until SIGTERM or SIGINT.
"""

from __future__ import annotations

import hmac
import logging
import signal
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.console.server import Listen
from supervisor.logging import get_logger
from supervisor.mcp.app import build_server
from supervisor.mcp.backend import Backend
from supervisor.mcp.config import McpSettings
from supervisor.sdnotify import notify

__all__ = ["BearerToken", "read_token", "serve_http"]

#: a request body at most (a tool call's arguments are far smaller)
MAX_BODY_BYTES: Final = 1_048_576
_MIN_TOKEN: Final = 16
GRACE_S: Final = 3.0


def read_token(path: Path) -> str:
    """The bearer token in *path* (its first line); `ValueError` names what is wrong."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"--token-file {path}: cannot be read: {exc.strerror}") from None
    if len(text) < _MIN_TOKEN or any(ch.isspace() for ch in text):
        raise ValueError(
            f"--token-file {path}: the token must be one line of at least {_MIN_TOKEN}"
            " characters without spaces (e.g. `openssl rand -hex 32`)"
        )
    return text


class BearerToken:
    """ASGI middleware: HTTP requests without the token get 401 and reach nothing."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = b'{"error":"unauthorized: send Authorization: Bearer <the token>"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


def _config(listen: Listen) -> Config:
    config = Config()
    config.bind = [listen.bind]
    config.umask = 0o117  # a Unix socket of mode 0660: its group may connect
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = GRACE_S
    config.include_server_header = False
    config.h11_max_incomplete_size = 16 * 1024
    return config


async def serve_http(
    settings: McpSettings,
    listen: Listen,
    token: str,
    *,
    handle_signals: bool = True,
    stop: anyio.Event | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve MCP over streamable HTTP at *listen* until a signal or *stop*; *task_status* is
    started with the endpoint's URL (or ``unix:PATH``) once it accepts connections."""
    if not listen.loopback:
        raise ValueError(
            f"--listen {listen.bind}: `hunter mcp --http` listens on loopback or a Unix socket"
            " only; put a reverse proxy in front for anything else"
        )
    log = get_logger("supervisor.mcp")
    stop = stop if stop is not None else anyio.Event()
    config = _config(listen)
    sockets = config.create_sockets()
    sock = sockets.insecure_sockets[0]
    name: str | tuple[str, int] = sock.getsockname()[:2] if sock.family != 1 else sock.getsockname()
    where = f"unix:{name}" if isinstance(name, str) else f"http://{listen.host}:{name[1]}/mcp"
    async with Backend.open(settings) as backend:
        server = build_server(backend)
        host = listen.host or "unix"
        starlette = server.streamable_http_app(max_request_body_size=MAX_BODY_BYTES, host=host)
        app = wrap_app(BearerToken(starlette, token), 16 * 1024, "asgi")  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(_on_signals, stop)

            async def serve() -> None:
                try:
                    await worker_serve(app, config, sockets=sockets, shutdown_trigger=stop.wait)
                finally:
                    stop.set()

            tg.start_soon(serve)
            await _until_listening(name)
            log.info("mcp_started", transport="http", listen=where, socket=str(settings.socket))
            notify("READY=1", f"STATUS=serving MCP on {where}")
            task_status.started(where)
            await stop.wait()
            log.info("mcp_stopping")
            notify("STOPPING=1")


async def _until_listening(name: str | tuple[str, int]) -> None:
    """Return once the socket accepts connections (hypercorn listens after binding)."""
    with anyio.fail_after(10):
        while True:
            try:
                stream: anyio.abc.ByteStream = (
                    await anyio.connect_unix(name)
                    if isinstance(name, str)
                    else await anyio.connect_tcp(name[0], name[1])
                )
            except OSError:
                await anyio.sleep(0.01)
                continue
            await stream.aclose()
            return


async def _on_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            return
