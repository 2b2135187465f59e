"""The sandbox helper's connection handler is an error boundary (issue 19): whatever a
connection does, an exception nobody foresaw included, costs that connection only (closed, and
logged naming the peer's uid and pid and the error), never the helper.

The helper is served in this process (a real `HelperServer` with a real `Runtime`, on a real
Unix socket) so that a fault can be injected with ``monkeypatch`` into the decoder its handler
calls (``wire.decode_request``, looked up at call time), raised only for a body that holds
`MARK`. The test process is the peer: the event must name ``os.getuid()`` and ``os.getpid()``.
The control and executor sockets' boundaries are in ``tests/supervisor/test_error_boundaries.py``.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
from structlog.testing import capture_logs

from sandbox.helper import wire
from sandbox.helper.server import HelperServer
from sandbox.runtime.runtime import Runtime, RuntimeConfig
from tests.injected_faults import FAULT_IDS, FAULTS, MARK

#: how long an answer, or a close, may take
ANSWER_S = 10.0


@asynccontextmanager
async def serving_helper(world: Path, root: Path) -> AsyncIterator[Path]:
    """A helper serving on ``world/h.sock`` in this process (its socket path); stopped after."""
    path = world / "h.sock"
    with Runtime(root, config=RuntimeConfig(kernel_audit="off")) as runtime:
        server = HelperServer(runtime, allowed_uids=[os.getuid()])
        listener = await anyio.create_unix_listener(path)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listener)
            try:
                yield path
            finally:
                tg.cancel_scope.cancel()
        server.close()


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def _reply(stream: anyio.abc.SocketStream) -> wire.Reply:
    """The next reply on *stream*."""
    received = b""
    with anyio.fail_after(ANSWER_S):
        while len(received) < wire.HEADER_SIZE or len(received) < wire.HEADER_SIZE + (
            wire.frame_length(received[: wire.HEADER_SIZE])
        ):
            received += await stream.receive()
    return wire.decode_reply(received[wire.HEADER_SIZE :])


async def _until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """What the helper still sends before it closes *stream* (it must, within `ANSWER_S`)."""
    received = b""
    with (
        anyio.fail_after(ANSWER_S),
        contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError),
    ):
        while True:
            received += await stream.receive()
    return received


async def _hello(stream: anyio.abc.SocketStream) -> None:
    """A `Hello` on *stream* is answered with a `Welcome`."""
    await stream.send(wire.encode(wire.Hello()))
    welcome = await _reply(stream)
    assert isinstance(welcome, wire.Welcome), welcome
    assert welcome.version == wire.PROTOCOL_VERSION


def _events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e.get("event") == name]


@pytest.mark.parametrize("make_fault", FAULTS, ids=FAULT_IDS)
async def test_a_fault_decoding_a_request_closes_only_its_connection(
    world: Path, root: Path, monkeypatch: pytest.MonkeyPatch, make_fault: Callable[[], Exception]
) -> None:
    """An unforeseen exception from decoding a request closes that connection without a reply,
    is logged with the peer's uid, pid and the error; the helper and a connection opened before
    carry on."""
    fault = make_fault()
    decode = wire.decode_request

    def decode_failing_when_marked(body: bytes) -> wire.Request:
        if MARK in body:
            raise fault
        return decode(body)

    monkeypatch.setattr(wire, "decode_request", decode_failing_when_marked)
    with capture_logs() as logs:
        async with serving_helper(world, root) as path:
            async with await anyio.connect_unix(path) as bystander:
                await _hello(bystander)
                async with await anyio.connect_unix(path) as marked:
                    await marked.send(_frame(msgspec.msgpack.encode({"op": "hello", "x": "BOOM"})))
                    assert await _until_closed(marked) == b""
                await _hello(bystander)
            async with await anyio.connect_unix(path) as fresh:
                await _hello(fresh)
    (event,) = _events(logs, "helper_connection_failed")
    assert (event["uid"], event["pid"]) == (os.getuid(), os.getpid()), event
    assert event["error"] == f"{type(fault).__name__}: {fault}", event


async def test_a_string_that_is_not_utf8_is_a_bad_request(world: Path, root: Path) -> None:
    """A request whose ``op`` is a msgpack str holding 0xc0 gets ``Failed(kind="bad_request")``
    naming UTF-8, then its connection closes; it is no failure and the helper still answers."""
    body = b"\x81\xa2op\xa1\xc0"  # {"op": <a 1-byte str: 0xc0, not UTF-8>}
    with capture_logs() as logs:
        async with serving_helper(world, root) as path:
            async with await anyio.connect_unix(path) as raw:
                await raw.send(_frame(body))
                failed = await _reply(raw)
                assert await _until_closed(raw) == b""
            assert isinstance(failed, wire.Failed), failed
            assert failed.kind == "bad_request", failed
            assert "UTF-8" in failed.message, failed
            async with await anyio.connect_unix(path) as fresh:
                await _hello(fresh)
    assert len(_events(logs, "helper_bad_request")) == 1
    assert _events(logs, "helper_connection_failed") == []
