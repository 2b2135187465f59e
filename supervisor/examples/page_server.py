"""A tiny HTTP page server on loopback for the web executor, the demo and the tests.

``PageServer(pages)`` serves an in-memory ``{path: html}`` mapping with the stdlib
``http.server`` in one background thread (started by ``start()``/``with``, stopped by
``close()``); it binds 127.0.0.1 on a free port unless told otherwise. ``DEMO_PAGES`` is a small
linked site every example command works on. ``python -m supervisor.examples.page_server``
serves the demo pages and prints the base URL on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Final

__all__ = ["DEMO_PAGES", "PageServer", "main"]

DEMO_PAGES: Final[Mapping[str, str]] = {
    "/": (
        "<!doctype html><html><head><title>Hunter demo</title></head><body>"
        '<nav id="top"><a class="nav" id="home" href="/">Home</a> '
        '<a class="nav" id="catalogue-link" href="/catalogue">Catalogue</a></nav>'
        '<h1 id="title">Welcome to the demo site</h1>'
        '<p class="intro">This page is served on loopback for the web executor.</p>'
        '<button id="hello" class="btn primary">Say hello</button>'
        "</body></html>"
    ),
    "/catalogue": (
        "<!doctype html><html><head><title>Catalogue</title></head><body>"
        '<h1 id="title">Catalogue</h1><ul id="items">'
        + "".join(
            f'<li class="item" data-sku="SKU-{n:03d}"><span class="name">Item {n}</span> '
            f'<span class="price">{n * 3}.00</span></li>'
            for n in range(1, 61)
        )
        + '</ul><a id="back" href="/">Back home</a></body></html>'
    ),
}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        page = self.server.pages.get(path)
        if page is None:
            body, status = b"<html><body><h1>404</h1></body></html>", 404
        else:
            body, status = page.encode("utf-8"), 200
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the executor logs what it fetched."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], pages: Mapping[str, str]) -> None:
        self.pages = dict(pages)
        super().__init__(address, _Handler)


class PageServer:
    """Serves ``pages`` over HTTP on ``host``:``port`` (0 = any free port) in a thread."""

    def __init__(
        self, pages: Mapping[str, str] = DEMO_PAGES, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self._server = _Server((host, port), pages)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def set_page(self, path: str, html: str) -> None:
        """Add or replace a page (takes effect for the next request)."""
        self._server.pages[path] = html

    def start(self) -> PageServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="page-server", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the module's command line)."""
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m supervisor.examples.page_server",
        description="Serve the demo pages on loopback; prints the base URL.",
    )
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = PageServer(port=args.port)
    sys.stdout.write(server.base_url + "\n")
    sys.stdout.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
