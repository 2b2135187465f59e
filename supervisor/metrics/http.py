"""A small HTTP/1.0 responder for `/metrics`, on the daemon's own anyio task group.

Prometheus scrapes with a plain ``GET /metrics``; this answers it (and ``HEAD``, and ``/`` with a
pointer) and closes the connection. No thread, no web framework: one task per connection in the
daemon's task group, a bounded request head, a deadline to send it. The body is rendered on the
event loop (the statistics it reads belong to the loop).

`parse_listen` reads the ``metrics.listen`` value: ``HOST:PORT`` (``[::1]:9464`` for IPv6) or a
Unix socket path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import anyio.abc

from supervisor.logging import get_logger

__all__ = ["CONTENT_TYPE", "TcpAddress", "parse_listen", "serve_metrics"]

#: The classic text format (0.0.4): every Prometheus and node-exporter version reads it.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEAD: Final = 8192
_READ_TIMEOUT_S: Final = 10.0
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


@dataclass(frozen=True, slots=True)
class TcpAddress:
    host: str
    port: int


def parse_listen(value: str) -> TcpAddress | Path:
    """``metrics.listen`` as a TCP address or a Unix socket path (validated by the config)."""
    if "/" in value:
        return Path(value)
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return TcpAddress(host, int(port))


async def serve_metrics(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    render: Callable[[], bytes],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer scrapes on *listener* until cancelled; *render* gives the exposition text."""
    async with listener, anyio.create_task_group() as tg:
        task_status.started()
        await listener.serve(partial(_answer, render), task_group=tg)


async def _read_head(stream: anyio.abc.SocketStream) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > _MAX_HEAD:
            return None
        try:
            data += await stream.receive(4096)
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return data or None
    return data


def _response(status: int, content_type: str, body: bytes, *, head_only: bool) -> bytes:
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


def _route(render: Callable[[], bytes], head: bytes) -> bytes:
    line = head.split(b"\n", 1)[0].decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _response(400, "text/plain", b"bad request\n", head_only=False)
    method, target = parts[0], parts[1].split("?", 1)[0]
    if method not in {"GET", "HEAD"}:
        return _response(405, "text/plain", b"GET or HEAD only\n", head_only=False)
    head_only = method == "HEAD"
    if target == "/metrics":
        try:
            body = render()
        except Exception as exc:  # a broken collector: say so, keep serving
            get_logger("supervisor.metrics").exception("metrics_scrape_failed", error=str(exc))
            return _response(500, "text/plain", b"metrics unavailable\n", head_only=head_only)
        return _response(200, CONTENT_TYPE, body, head_only=head_only)
    if target == "/":
        body = b"hunter: metrics at /metrics\n"
        return _response(200, "text/plain", body, head_only=head_only)
    return _response(404, "text/plain", b"not found: try /metrics\n", head_only=head_only)


async def _answer(render: Callable[[], bytes], stream: anyio.abc.SocketStream) -> None:
    async with stream:
        with anyio.move_on_after(_READ_TIMEOUT_S):
            head = await _read_head(stream)
            if head is None:
                return
            reply = _route(render, head)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(reply)
