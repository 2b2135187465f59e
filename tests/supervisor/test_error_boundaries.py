"""Each connection's handler is an error boundary (issue 19): whatever a connection does, an
exception nobody foresaw included, costs that connection only (closed, and logged naming the
peer's uid and pid and the error), never the server or the daemon.

Here for ``control.sock`` (a real in-process daemon) and ``executors.sock`` (a real hub): the
fault is injected with ``monkeypatch`` into the decoder the handler calls, raised only for a body
that holds `MARK`, so every other connection is served as usual. The test process is the peer,
so the event must name ``os.getuid()`` and ``os.getpid()``. Each socket also gets the real bad
frame of the issue (a JSON string that is not UTF-8): a clean frame error, not a failure. The
sandbox helper's boundary is in ``tests/sandbox/helper/test_helper_boundary.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from structlog.testing import capture_logs

import supervisor.control.connections as control_connections
import supervisor.executors.link as executor_link
import supervisor.executors.reception as executor_reception
from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorStatus
from supervisor.control.client import call_once
from supervisor.demo.stack import prepare_root
from supervisor.executors.hub import AttemptReport
from supervisor.wire.control import decode_request
from supervisor.wire.executor import decode_executor_message, decode_hello
from supervisor.wire.frames import FrameReader, decode_body, encode_frame
from tests.injected_faults import FAULT_IDS, FAULTS, MARK
from tests.supervisor.control.test_server import daemon_client
from tests.supervisor.executors.harness import (
    Harness,
    hello_answer,
    hello_frame,
    instruction,
    raw_client,
    running_hub,
)

#: how long a closed connection may take to read as closed
CLOSE_S = 10.0


def _failing_when_marked(
    decode: Callable[[Any], object], fault: Callable[[], Exception]
) -> Callable[[Any], object]:
    """*decode* (of a frame body), except that a body holding `MARK` raises *fault* instead."""

    def wrapped(body: Any) -> object:
        if MARK in bytes(body):
            raise fault()
        return decode(body)

    return wrapped


async def _until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """What the server still sends before it closes *stream* (it must, within `CLOSE_S`)."""
    received = b""
    with (
        anyio.fail_after(CLOSE_S),
        contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError),
    ):
        while True:
            received += await stream.receive()
    return received


def _events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e.get("event") == name]


def _names_the_peer_and_the_fault(event: Mapping[str, Any], fault: Exception) -> None:
    assert (event["uid"], event["pid"]) == (os.getuid(), os.getpid()), event
    error = event["error"]
    assert isinstance(error, str), event
    assert type(fault).__name__ in error, event
    assert "injected" in error, event


# -- control.sock -------------------------------------------------------------------------------


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh daemon root with the demo package (as in control/test_server.py); removed after."""
    base = Path(tempfile.mkdtemp(prefix="hh-eb-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _request(request_id: object, op: str, **params: object) -> bytes:
    return encode_frame({"id": request_id, "op": op, "params": params})


async def _control_fault_costs_its_connection_only(
    root: Path, fault: Exception, marked_request: bytes
) -> None:
    """Send *marked_request* on a connection of its own (its handling raises *fault*), with a
    request in flight on a connection opened before; then check the boundary held."""
    with capture_logs() as logs:
        async with daemon_client(root) as client:
            sock = client.socket_path
            async with await anyio.connect_unix(sock) as bystander:
                # in flight across the fault: answered only after its 0.5 s
                await bystander.send(
                    _request(7, "executors.wait", executor_id="nobody", timeout_s=0.5)
                )
                async with await anyio.connect_unix(sock) as marked:
                    await marked.send(marked_request)
                    assert await _until_closed(marked) == b""
                reader = FrameReader(bystander)
                with anyio.fail_after(CLOSE_S):
                    waited = await reader.read()
                assert (waited["id"], waited["error"]["code"]) == (7, "timeout"), waited
                await bystander.send(_request(8, "status"))
                with anyio.fail_after(CLOSE_S):
                    status = await reader.read()
                assert (status["id"], status["ok"]) == (8, True), status
            assert (await client.call("status"))["daemon"]["pid"] == os.getpid()
            assert (await call_once(sock, "status"))["daemon"]["pid"] == os.getpid()
    (event,) = _events(logs, "control_connection_failed")
    _names_the_peer_and_the_fault(event, fault)


@pytest.mark.parametrize("make_fault", FAULTS, ids=FAULT_IDS)
async def test_control_a_fault_decoding_a_request_closes_only_its_connection(
    root: Path, monkeypatch: pytest.MonkeyPatch, make_fault: Callable[[], Exception]
) -> None:
    """An unforeseen exception from decoding a request closes that connection, is logged with
    the peer's uid, pid and the error, and the daemon and its other connections carry on."""
    fault = make_fault()
    monkeypatch.setattr(
        control_connections,
        "decode_request",
        _failing_when_marked(decode_request, lambda: fault),
    )
    marked = _request(1, "ping", note=MARK.decode())
    await _control_fault_costs_its_connection_only(root, fault, marked)


async def test_control_a_fault_in_a_request_task_closes_only_its_connection(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unforeseen exception in a request's own task (framing its answer) leaves the
    connection's task group: that connection is closed and logged, nothing else is touched."""
    fault = RuntimeError("injected")

    def encode_failing_when_marked(obj: object, *, max_bytes: int | None = None) -> bytes:
        if isinstance(obj, dict) and obj.get("id") == MARK.decode():
            raise fault
        return encode_frame(obj, max_bytes=max_bytes)  # the original: imported here

    monkeypatch.setattr(control_connections, "encode_frame", encode_failing_when_marked)
    marked = _request(MARK.decode(), "ping")
    await _control_fault_costs_its_connection_only(root, fault, marked)


async def test_control_a_string_that_is_not_utf8_is_a_bad_frame(root: Path) -> None:
    """``{"id":1,"op":"\\xc0"}`` gets a bad_request naming UTF-8 and its connection closes;
    it is a frame error, not a failure, and the daemon still answers."""
    with capture_logs() as logs:
        async with daemon_client(root) as client:
            body = b'{"id":1,"op":"\xc0"}'
            async with await anyio.connect_unix(client.socket_path) as raw:
                await raw.send(len(body).to_bytes(4, "big") + body)
                received = await _until_closed(raw)
            assert received, "closed without an answer"
            answer = decode_body(received[4:])
            assert answer["ok"] is False, answer
            assert answer["error"]["code"] == "bad_request", answer
            assert "UTF-8" in answer["error"]["message"], answer
            assert (await client.call("status"))["daemon"]["pid"] == os.getpid()
            assert (await call_once(client.socket_path, "status"))["daemon"]["draining"] is False
    assert len(_events(logs, "control_frame_error")) == 1
    assert _events(logs, "control_connection_failed") == []


# -- executors.sock -----------------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for the hub's socket (AF_UNIX paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hh-eb-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _welcomed(h: Harness, executor_id: str) -> tuple[anyio.abc.SocketStream, FrameReader]:
    """A raw executor connection past its welcome."""
    stream, reader = await raw_client(h.socket)
    await stream.send(encode_frame(hello_frame(executor_id)))
    with anyio.fail_after(CLOSE_S):
        welcome = await reader.read()
    assert welcome["type"] == "welcome", welcome
    return stream, reader


async def _hub_fault_costs_its_connection_only(
    h: Harness, fault: Exception, fail: Callable[[Harness], Any]
) -> None:
    """With an attempt in flight on a real executor, run *fail* (a connection whose handling
    raises *fault*); then check the boundary held and the hub serves on."""
    await h.spawn("steady", "slow,ok", extra=("--delay-ms", "500"))
    reports: list[AttemptReport] = []

    async def attempt() -> None:
        reports.append(await h.hub.run_attempt(instruction()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt)
        with anyio.fail_after(CLOSE_S):
            await h.hub.wait_for_executor("steady", status=ExecutorStatus.BUSY)
        await fail(h)
        event = await h.log.wait_for("connection_failed")
    _names_the_peer_and_the_fault(event, fault)
    assert [r.outcome.kind for r in reports] == [OutcomeKind.SUCCESS]  # undisturbed
    assert (await hello_answer(h.socket, hello_frame("after-1")))["type"] == "welcome"
    after = await h.hub.run_attempt(instruction())
    assert (after.outcome.kind, after.executor_id) == (OutcomeKind.SUCCESS, "steady")


@pytest.mark.parametrize("make_fault", FAULTS, ids=FAULT_IDS)
async def test_executors_a_fault_decoding_a_hello_closes_only_its_connection(
    socket_dir: Path, monkeypatch: pytest.MonkeyPatch, make_fault: Callable[[], Exception]
) -> None:
    """An unforeseen exception from decoding a hello closes that connection, is logged with the
    peer's uid, pid and the error; the hub and its executors carry on."""
    fault = make_fault()
    monkeypatch.setattr(
        executor_reception,
        "decode_hello",
        _failing_when_marked(decode_hello, lambda: fault),
    )

    async def fail(h: Harness) -> None:
        stream, _ = await raw_client(h.socket)
        async with stream:
            await stream.send(encode_frame(hello_frame("marked", software=MARK.decode())))
            assert await _until_closed(stream) == b""

    async with running_hub(socket_dir) as h:
        await _hub_fault_costs_its_connection_only(h, fault, fail)


@pytest.mark.parametrize("make_fault", FAULTS, ids=FAULT_IDS)
async def test_executors_a_fault_after_the_welcome_closes_only_its_connection(
    socket_dir: Path, monkeypatch: pytest.MonkeyPatch, make_fault: Callable[[], Exception]
) -> None:
    """An unforeseen exception from decoding a welcomed executor's message closes that
    connection (the executor is unregistered: its id may connect again) and is logged with the
    peer's uid, pid and the error; the hub and its other executors carry on."""
    fault = make_fault()
    monkeypatch.setattr(
        executor_link,
        "decode_executor_message",
        _failing_when_marked(decode_executor_message, lambda: fault),
    )

    async def fail(h: Harness) -> None:
        stream, _ = await _welcomed(h, "marked")
        async with stream:
            await stream.send(
                encode_frame({"type": "heartbeat", "ts_us": 1, "note": MARK.decode()})
            )
            await _until_closed(stream)  # heartbeats may come first; then the close

    async with running_hub(socket_dir) as h:
        await _hub_fault_costs_its_connection_only(h, fault, fail)
        info = h.hub.executor("marked")
        assert info is not None
        assert info.status is ExecutorStatus.OFFLINE
        assert (await hello_answer(h.socket, hello_frame("marked")))["type"] == "welcome"


async def test_executors_a_hello_string_that_is_not_utf8_is_rejected(socket_dir: Path) -> None:
    """A hello ``{"type":"\\xc0"}`` gets the reject of a bad first frame, not a failure."""
    async with running_hub(socket_dir) as h:
        stream, _ = await raw_client(h.socket)
        body = b'{"type":"\xc0"}'
        async with stream:
            await stream.send(len(body).to_bytes(4, "big") + body)
            received = await _until_closed(stream)
        assert received, "closed without a reject"
        reject = decode_body(received[4:])
        assert (reject["type"], reject["reason_code"]) == ("reject", "BAD_MESSAGE"), reject
        assert "UTF-8" in str(reject["reason"]), reject
        event = await h.log.wait_for("frame_error")
        assert (event["uid"], event["pid"]) == (os.getuid(), os.getpid()), event
        assert (await hello_answer(h.socket, hello_frame("after-1")))["type"] == "welcome"
        assert h.log.find("connection_failed") == []


async def test_executors_a_message_string_that_is_not_utf8_is_a_frame_error(
    socket_dir: Path,
) -> None:
    """After the welcome, ``{"type":"\\xc0"}`` closes the connection as a frame error, not a
    failure; the same executor may connect again."""
    async with running_hub(socket_dir) as h:
        stream, _ = await _welcomed(h, "bad-utf8")
        body = b'{"type":"\xc0"}'
        async with stream:
            await stream.send(len(body).to_bytes(4, "big") + body)
            await _until_closed(stream)
        event = await h.log.wait_for("frame_error", executor_id="bad-utf8")
        assert event["error"] == "FrameDecodeError", event
        assert "UTF-8" in event["reason"], event
        assert (event["uid"], event["pid"]) == (os.getuid(), os.getpid()), event
        await h.log.wait_for("executor_disconnected", executor_id="bad-utf8")
        assert (await hello_answer(h.socket, hello_frame("bad-utf8")))["type"] == "welcome"
        assert h.log.find("connection_failed") == []
