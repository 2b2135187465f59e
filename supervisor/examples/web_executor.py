"""A working executor: browses pages from a local HTTP server (one "tab", no browser engine).

Run: ``python -m supervisor.examples.web_executor --socket PATH --id web-1`` (add
``--serve-pages`` to start the demo page server in the same process; its URL goes to stdout).

Commands and their evidence (``evidence_hash`` is always the sha256 of the evidence bytes):

* NAVIGATE ``target_url`` — HTTP GET (loopback hosts only unless ``--allow-host``; redirects
  are not followed). Evidence: the response body as received. Output: url, status, title,
  bytes. HTTP status >= 400 → FAILURE.
* READ ``target_selector`` — text content of the first match. Evidence: that text, UTF-8.
* EXTRACT ``target_selector`` — every match as ``{tag, text, attributes}`` (or only the
  attribute named by parameter ``attribute``). Evidence: the items as JSON with sorted keys.
  More than parameter ``max_items`` (default 500) matches → the first ones, ``partial=true``.
* SCROLL [``target_selector``] — parameter ``to`` (absolute line) or ``lines`` (relative,
  default one viewport), or to the line holding the selector's text. Evidence: the visible
  viewport text (24 lines of 80 columns, newline-joined).
* CLICK ``target_selector`` — a link (``<a href>``) is followed like NAVIGATE (evidence: the new
  body); anything else is "pressed" (evidence: ``click <selector>: <element text>``).
* SCREENSHOT [``target_selector``] — renders the viewport (or the element's text) as a PGM
  image (see ``html_model.render_pgm``). Evidence: the image bytes.

Selectors: the CSS subset of ``supervisor.examples.html_model`` (tag, #id, .class, compounds,
descendants). Without a loaded page every command but NAVIGATE answers FAILURE.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson

from supervisor.examples._cli import configure_example_logging, run_until_signal
from supervisor.examples.html_model import (
    VIEWPORT_COLUMNS,
    VIEWPORT_ROWS,
    Element,
    SelectorError,
    parse_html,
    render_pgm,
    select,
    visible_lines,
)
from supervisor.examples.page_server import PageServer
from supervisor.sdk import Executor, Instruction, Result, run_executor

__all__ = ["LOOPBACK_HOSTS", "WebExecutor", "main"]

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_MAX_BODY: Final = 4 * 1024 * 1024
_DEFAULT_MAX_ITEMS: Final = 500


@dataclass(frozen=True, slots=True)
class _Page:
    url: str
    status: int
    body: bytes
    root: Element
    lines: tuple[str, ...]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebExecutor(Executor):
    """Serves NAVIGATE, READ, EXTRACT, SCROLL, CLICK and SCREENSHOT on one page at a time."""

    software = "hunter-web-executor/1"

    def __init__(
        self,
        *,
        executor_id: str,
        allowed_hosts: frozenset[str] = LOOPBACK_HOSTS,
        slots: int = 1,
    ) -> None:
        super().__init__(executor_id=executor_id, slots=slots)
        self.allowed_hosts = allowed_hosts
        self._page: _Page | None = None
        self._scroll = 0
        self._lock = anyio.Lock()
        self._opener = urllib.request.build_opener(_NoRedirects())

    # -- fetching ------------------------------------------------------------------------------
    def _fetch_blocking(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        try:
            with self._opener.open(url, timeout=timeout_s) as response:
                return int(response.status), response.read(_MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            with exc:
                return int(exc.code), exc.read(_MAX_BODY + 1)

    async def _load(self, url: str, instruction: Instruction) -> Result:
        host = urllib.parse.urlsplit(url).hostname or ""
        if host not in self.allowed_hosts and f"[{host}]" not in self.allowed_hosts:
            return Result.refused(f"host {host!r} is not allowed (allowed: loopback)")
        timeout_s = max(0.1, instruction.timeout_ms / 1000)
        try:
            status, body = await anyio.to_thread.run_sync(
                self._fetch_blocking, url, timeout_s, abandon_on_cancel=True
            )
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return Result.failure(f"fetching {url} failed: {exc}")
        if len(body) > _MAX_BODY:
            return Result.failure(f"{url} is larger than {_MAX_BODY} bytes")
        root = parse_html(body.decode("utf-8", errors="replace"))
        page = _Page(url, status, body, root, tuple(visible_lines(root)))
        titles = select(root, "title")
        output = {
            "url": url,
            "status": status,
            "title": titles[0].text() if titles else "",
            "bytes": len(body),
        }
        if status >= 400 or status < 200:
            return Result.failure(f"GET {url} answered HTTP {status}", output=output)
        self._page, self._scroll = page, 0
        return Result.success(body, output=output, attach_evidence=True)

    def _current(self) -> _Page | None:
        return self._page

    def _matches(self, selector: str) -> tuple[_Page, list[Element]] | Result:
        page = self._current()
        if page is None:
            return Result.failure("no page is loaded: NAVIGATE first")
        try:
            return page, select(page.root, selector)
        except SelectorError as exc:
            return Result.refused(str(exc))

    def _viewport(self, page: _Page) -> str:
        return "\n".join(page.lines[self._scroll : self._scroll + VIEWPORT_ROWS])

    # -- handlers ------------------------------------------------------------------------------
    async def navigate(self, instruction: Instruction) -> Result:
        async with self._lock:
            return await self._load(instruction.target_url, instruction)

    async def read(self, instruction: Instruction) -> Result:
        async with self._lock:
            found = self._matches(instruction.target_selector)
            if isinstance(found, Result):
                return found
            _, elements = found
            if not elements:
                return Result.failure(f"no element matches {instruction.target_selector!r}")
            text = elements[0].text()
            return Result.success(
                text.encode("utf-8"),
                output={"text": text, "matches": len(elements)},
                attach_evidence=True,
            )

    async def extract(self, instruction: Instruction) -> Result:
        async with self._lock:
            found = self._matches(instruction.target_selector)
            if isinstance(found, Result):
                return found
            _, elements = found
            attribute = instruction.parameters.get("attribute")
            max_items = instruction.parameters.get("max_items", _DEFAULT_MAX_ITEMS)
            if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1:
                return Result.refused("parameter max_items must be a positive integer")
            items: list[object]
            if isinstance(attribute, str):
                items = [e.attrs.get(attribute, "") for e in elements[:max_items]]
            else:
                items = [
                    {"tag": e.tag, "text": e.text(), "attributes": dict(e.attrs)}
                    for e in elements[:max_items]
                ]
            evidence = orjson.dumps(items, option=orjson.OPT_SORT_KEYS)
            partial = len(elements) > max_items
            output = {"items": items, "count": len(items), "matches": len(elements)}
            return Result.success(evidence, output=output, partial=partial, attach_evidence=True)

    async def scroll(self, instruction: Instruction) -> Result:
        async with self._lock:
            page = self._current()
            if page is None:
                return Result.failure("no page is loaded: NAVIGATE first")
            params = instruction.parameters
            last = max(0, len(page.lines) - VIEWPORT_ROWS)
            if instruction.target_selector:
                found = self._matches(instruction.target_selector)
                if isinstance(found, Result):
                    return found
                _, elements = found
                if not elements:
                    return Result.failure(f"no element matches {instruction.target_selector!r}")
                needle = elements[0].text()[:VIEWPORT_COLUMNS]
                target = next((i for i, line in enumerate(page.lines) if needle in line), 0)
            elif isinstance(params.get("to"), int):
                target = int(params["to"])
            else:
                step = params.get("lines", VIEWPORT_ROWS)
                if not isinstance(step, int) or isinstance(step, bool):
                    return Result.refused("parameter lines must be an integer")
                target = self._scroll + step
            self._scroll = min(max(0, target), last)
            visible = self._viewport(page)
            output = {"scroll": self._scroll, "total_lines": len(page.lines), "visible": visible}
            return Result.success(visible.encode("utf-8"), output=output, attach_evidence=True)

    async def click(self, instruction: Instruction) -> Result:
        async with self._lock:
            found = self._matches(instruction.target_selector)
            if isinstance(found, Result):
                return found
            page, elements = found
            if not elements:
                return Result.failure(f"no element matches {instruction.target_selector!r}")
            element = elements[0]
            href = element.attrs.get("href")
            if element.tag == "a" and href:
                target = urllib.parse.urljoin(page.url, href)
                result = await self._load(target, instruction)
                return Result(
                    result.response_type,
                    evidence_hash=result.evidence_hash,
                    error_message=result.error_message,
                    output={**result.output, "navigated": True},
                )
            text = element.text()
            evidence = f"click {instruction.target_selector}: {text}"
            return Result.success(
                evidence, output={"navigated": False, "text": text}, attach_evidence=True
            )

    async def screenshot(self, instruction: Instruction) -> Result:
        async with self._lock:
            page = self._current()
            if page is None:
                return Result.failure("no page is loaded: NAVIGATE first")
            if instruction.target_selector:
                found = self._matches(instruction.target_selector)
                if isinstance(found, Result):
                    return found
                _, elements = found
                if not elements:
                    return Result.failure(f"no element matches {instruction.target_selector!r}")
                image = render_pgm(visible_lines(elements[0]))
            else:
                image = render_pgm(list(page.lines), scroll=self._scroll)
            header_end = image.index(b"255\n") + 4
            width, height = (int(v) for v in image[3:header_end].split()[:2])
            output: Mapping[str, object] = {
                "format": "image/x-portable-graymap",
                "width": width,
                "height": height,
                "bytes": len(image),
            }
            return Result.success(image, output=output, attach_evidence=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m supervisor.examples.web_executor",
        description="An executor that browses pages served on loopback.",
    )
    parser.add_argument("--socket", required=True, help="the daemon's executors.sock")
    parser.add_argument("--id", dest="executor_id", required=True, help="executor id")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="a host NAVIGATE may fetch from besides loopback (repeatable)",
    )
    parser.add_argument(
        "--serve-pages",
        action="store_true",
        help="also serve the demo pages on 127.0.0.1 (the base URL is printed on stdout)",
    )
    parser.add_argument("--pages-port", type=int, default=0)
    parser.add_argument("--no-reconnect", action="store_true")
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_example_logging(args.log_level)
    executor = WebExecutor(
        executor_id=args.executor_id,
        allowed_hosts=LOOPBACK_HOSTS | frozenset(args.allow_host),
        slots=args.slots,
    )
    server = PageServer(port=args.pages_port).start() if args.serve_pages else None
    if server is not None:
        sys.stdout.write(server.base_url + "\n")
        sys.stdout.flush()
    try:
        return run_until_signal(
            lambda: run_executor(executor, socket_path=args.socket, reconnect=not args.no_reconnect)
        )
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    raise SystemExit(main())
