"""The `/metrics` responder on real loopback TCP sockets, and the node-exporter textfile."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.metrics import CONTENT_TYPE, serve_metrics, write_textfiles


def _registry() -> tuple[CollectorRegistry, Gauge]:
    registry = CollectorRegistry()
    gauge = Gauge("hunter_test_things", "Things.", registry=registry)
    return registry, gauge


@contextlib.asynccontextmanager
async def _served(render: Callable[[], bytes]) -> AsyncIterator[int]:
    """Serve *render* on 127.0.0.1 (a free port) until the block ends; yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, listener, render)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()


async def _request(port: int, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(raw)
        data = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                data += await stream.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, headers, body


async def test_get_metrics_returns_the_current_exposition() -> None:
    """GET /metrics answers 200 with the text format; each scrape renders anew."""
    registry, gauge = _registry()
    async with _served(lambda: generate_latest(registry)) as port:
        gauge.set(3)
        status, headers, body = await _request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == "HTTP/1.0 200 OK"
        assert headers["Content-Type"] == CONTENT_TYPE
        assert int(headers["Content-Length"]) == len(body)
        (family,) = text_string_to_metric_families(body.decode())
        assert (family.name, family.samples[0].value) == ("hunter_test_things", 3.0)
        gauge.set(4)
        _, _, again = await _request(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
        assert b"hunter_test_things 4.0" in again


async def test_head_other_paths_and_methods() -> None:
    """HEAD has no body, unknown paths are 404, other methods 405, garbage 400."""
    registry, _ = _registry()
    async with _served(lambda: generate_latest(registry)) as port:
        status, headers, body = await _request(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert (status, body) == ("HTTP/1.0 200 OK", b"")
        assert int(headers["Content-Length"]) > 0
        assert (await _request(port, b"GET /nope HTTP/1.0\r\n\r\n"))[0] == "HTTP/1.0 404 Not Found"
        assert (await _request(port, b"POST /metrics HTTP/1.0\r\n\r\n"))[0] == (
            "HTTP/1.0 405 Method Not Allowed"
        )
        assert (await _request(port, b"hello\r\n\r\n"))[0] == "HTTP/1.0 400 Bad Request"


async def test_a_failing_render_is_a_500_and_serving_goes_on() -> None:
    """A collector that raises gives that scrape a 500; the next scrape is answered."""
    registry, _ = _registry()
    calls = [0]

    def render() -> bytes:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("collector broke")
        return generate_latest(registry)

    async with _served(render) as port:
        assert (await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n"))[0] == (
            "HTTP/1.0 500 Internal Server Error"
        )
        assert (await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n"))[0] == "HTTP/1.0 200 OK"


async def test_textfile_is_written_before_start_returns_and_replaced(tmp_path: Path) -> None:
    """The textfile exists once the writer started, parses, and leaves no temporary file."""
    registry, gauge = _registry()
    path = tmp_path / "hunter.prom"
    gauge.set(2)
    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: write_textfiles(
                path, lambda: generate_latest(registry), interval_s=3600, task_status=task_status
            )
        )
        tg.cancel_scope.cancel()
    (family,) = text_string_to_metric_families(path.read_text("utf-8"))
    assert family.samples[0].value == 2.0
    assert [p.name async for p in anyio.Path(tmp_path).iterdir()] == ["hunter.prom"]


async def test_textfile_in_a_missing_directory_does_not_stop_the_writer(tmp_path: Path) -> None:
    """A textfile that cannot be written is logged; the writer starts and keeps going."""
    registry, _ = _registry()
    path = tmp_path / "missing" / "hunter.prom"
    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: write_textfiles(
                path, lambda: generate_latest(registry), interval_s=3600, task_status=task_status
            )
        )
        tg.cancel_scope.cancel()
    assert not path.parent.exists()
