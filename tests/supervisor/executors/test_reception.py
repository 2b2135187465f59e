"""The door of executors.sock (``supervisor.executors.reception``): the listener, the hello and
its rejects.

The uid check, unknown versions and duplicate ids are in test_hub.py (named there by
``docs/requirements-coverage.md``)."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import anyio
import pytest

from supervisor.executors.hub import open_executor_listener
from supervisor.wire.frames import decode_body
from tests.supervisor.executors.harness import hello_answer, hello_frame, raw_client, running_hub


async def test_garbage_before_hello_is_rejected(socket_dir: Path) -> None:
    """Undecodable bytes instead of a hello get the promised reject, then the close."""
    async with running_hub(socket_dir) as h:
        stream, _ = await raw_client(h.socket)
        async with stream:
            await stream.send(struct.pack(">I", 3) + b"abc")
            received = b""
            with anyio.fail_after(5), contextlib.suppress(anyio.EndOfStream):
                while True:
                    received += await stream.receive()
        event = await h.log.wait_for("frame_error")
    assert event["executor_id"] is None
    assert event["error"] == "FrameDecodeError"
    reject = decode_body(received[4:])
    assert reject["type"] == "reject"
    assert reject["reason_code"] == "BAD_MESSAGE"
    assert "first frame must be a hello" in str(reject["reason"])


async def test_bad_hello_is_rejected_naming_the_field(socket_dir: Path) -> None:
    """A hello with an unknown command type → reject BAD_HELLO naming the field."""
    async with running_hub(socket_dir) as h:
        answer = await hello_answer(h.socket, hello_frame("odd-1", commands=["TELEPORT"]))
    assert answer["reason_code"] == "BAD_HELLO"
    assert answer["reason"] == "field 'commands' names an unknown command type 'TELEPORT'"


async def test_silent_connection_gets_hello_timeout(socket_dir: Path) -> None:
    """A connection that never says hello is rejected after hello_timeout_s."""
    async with running_hub(socket_dir, hello_timeout_s=0.2) as h:
        stream, reader = await raw_client(h.socket)
        async with stream:
            with anyio.fail_after(5):
                answer = await reader.read()
    assert answer["reason_code"] == "HELLO_TIMEOUT"


async def test_listener_socket_mode_and_stale_file(socket_dir: Path) -> None:
    """The socket is created 0660; a stale socket file is replaced, a live one is refused."""
    path = socket_dir / "ex.sock"
    listener = await open_executor_listener(path)
    try:
        assert (await anyio.Path(path).stat()).st_mode & 0o777 == 0o660
        with pytest.raises(OSError, match=r"is in use by a running daemon$"):
            await open_executor_listener(path)
    finally:
        await listener.aclose()
    # aclose leaves the file behind: a stale socket nobody accepts on
    assert await anyio.Path(path).exists()
    again = await open_executor_listener(path)
    await again.aclose()
