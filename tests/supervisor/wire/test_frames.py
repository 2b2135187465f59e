"""Tests of supervisor.wire.frames: the 4-byte length prefix + JSON object framing."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import anyio
import orjson
import pytest
from anyio.abc import ByteReceiveStream
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.wire.frames import (
    FrameDecodeError,
    FrameReader,
    FrameTooLarge,
    FrameTruncated,
    FrameWriter,
    decode_body,
    encode_frame,
    read_frame,
    write_frame,
)


class ChunkStream(ByteReceiveStream):
    """A byte stream that delivers the given chunks (cut to max_bytes) and then EOF."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = [c for c in chunks if c]
        self.receive_calls = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        self.receive_calls += 1
        await anyio.lowlevel.checkpoint()
        if not self.chunks:
            raise anyio.EndOfStream
        chunk = self.chunks[0]
        head, rest = chunk[:max_bytes], chunk[max_bytes:]
        if rest:
            self.chunks[0] = rest
        else:
            self.chunks.pop(0)
        return head

    async def aclose(self) -> None:
        self.chunks = []


def test_encode_frame_is_big_endian_length_plus_orjson_body() -> None:
    """encode_frame writes the body length as 4 big-endian bytes before the orjson body."""
    frame = encode_frame({"type": "heartbeat", "ts_us": 5})
    body = orjson.dumps({"type": "heartbeat", "ts_us": 5})
    assert frame == struct.pack(">I", len(body)) + body


def test_encode_frame_refuses_oversized_body() -> None:
    """encode_frame raises FrameTooLarge when the body exceeds max_bytes."""
    with pytest.raises(FrameTooLarge, match=r"^frame of \d+ bytes exceeds the 10-byte limit$"):
        encode_frame({"text": "x" * 20}, max_bytes=10)


async def test_reader_decodes_frames_split_and_batched() -> None:
    """Frames split over chunks and several frames in one chunk both decode in order."""
    data = b"".join(encode_frame({"n": n}) for n in range(5))
    stream = ChunkStream([data[:3], data[3:17], data[17:]])
    reader = FrameReader(stream)
    assert [await reader.read() for _ in range(5)] == [{"n": n} for n in range(5)]
    with pytest.raises(anyio.EndOfStream):
        await reader.read()


async def test_reader_rejects_oversized_header_before_body() -> None:
    """A header announcing more than max_bytes raises FrameTooLarge without reading the body."""
    stream = ChunkStream([struct.pack(">I", 2_000_000), b"{" * 10])
    reader = FrameReader(stream, max_bytes=1_000_000)
    with pytest.raises(FrameTooLarge, match=r"^frame of 2000000 bytes exceeds") as info:
        await reader.read()
    assert info.value.size == 2_000_000
    assert info.value.max_bytes == 1_000_000


async def test_reader_reports_truncated_body() -> None:
    """EOF in the middle of a body raises FrameTruncated with the byte counts."""
    stream = ChunkStream([struct.pack(">I", 50) + b'{"type": "resp'])
    with pytest.raises(FrameTruncated, match=r"^stream ended after 18 bytes of a frame") as info:
        await FrameReader(stream).read()
    assert info.value.expected == 54


async def test_reader_reports_truncated_header() -> None:
    """EOF after part of a header raises FrameTruncated (not a clean EndOfStream)."""
    with pytest.raises(FrameTruncated, match=r"a 4-byte header expected"):
        await FrameReader(ChunkStream([b"\x00\x00"])).read()


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        (b"\xff\xfe not json", r"^frame body is not valid UTF-8 JSON"),
        (b"[1, 2, 3]", r"^frame body is a JSON list, not an object$"),
        (b'"text"', r"^frame body is a JSON str, not an object$"),
        (b"{", r"^frame body of 1 bytes cannot hold a JSON object$"),
    ],
)
async def test_reader_rejects_bodies_that_are_not_objects(body: bytes, pattern: str) -> None:
    """Bodies that are not UTF-8 JSON objects raise FrameDecodeError."""
    stream = ChunkStream([struct.pack(">I", len(body)) + body])
    with pytest.raises(FrameDecodeError, match=pattern):
        await FrameReader(stream).read()


async def test_read_frame_on_bare_stream_never_reads_past_the_frame() -> None:
    """read_frame on a bare stream leaves the next frame's bytes in the stream."""
    data = encode_frame({"a": 1}) + encode_frame({"b": 2})
    stream = ChunkStream([data])
    assert await read_frame(stream, max_bytes=100) == {"a": 1}
    assert await read_frame(stream, max_bytes=100) == {"b": 2}
    with pytest.raises(anyio.EndOfStream):
        await read_frame(stream)


async def test_read_frame_on_bare_stream_checks_limits() -> None:
    """read_frame on a bare stream applies max_bytes and detects truncation."""
    with pytest.raises(FrameTooLarge):
        await read_frame(ChunkStream([encode_frame({"x": "y" * 50})]), max_bytes=10)
    with pytest.raises(FrameTruncated):
        await read_frame(ChunkStream([encode_frame({"x": 1})[:-2]]))


async def test_write_frame_sends_one_chunk_over_a_socket_pair() -> None:
    """write_frame sends a frame that FrameReader on the other end decodes."""
    left, right = await _socket_pair()
    async with left, right:
        await write_frame(left, {"type": "status", "status": "READY"})
        assert await read_frame(FrameReader(right)) == {"type": "status", "status": "READY"}


async def test_frame_writer_never_interleaves_concurrent_large_frames() -> None:
    """Concurrent FrameWriter sends of frames larger than the socket buffer arrive whole."""
    left, right = await _socket_pair()
    writer = FrameWriter(left)
    received: list[dict[str, Any]] = []

    async def sender(tag: str) -> None:
        for n in range(4):
            await writer.send_frame({"tag": tag, "n": n, "blob": tag * 300_000})

    async with left, right, anyio.create_task_group() as tg:
        tg.start_soon(sender, "a")
        tg.start_soon(sender, "b")
        reader = FrameReader(right, max_bytes=1_000_000)
        for _ in range(8):
            received.append(await reader.read())
    assert all(f["blob"] == f["tag"] * 300_000 for f in received)
    assert sorted((f["tag"], f["n"]) for f in received) == [(t, n) for t in "ab" for n in range(4)]


async def test_frame_writer_reports_a_closed_peer() -> None:
    """Sending to a peer that has gone away raises BrokenResourceError."""
    left, right = await _socket_pair()
    await right.aclose()
    async with left:
        writer = FrameWriter(left)
        with pytest.raises(anyio.BrokenResourceError):
            await writer.send(encode_frame({"x": "y" * 10_000}))


async def test_frames_over_tcp_loopback_use_the_stream() -> None:
    """Over a TCP stream (transport-based on asyncio) frames go through anyio intact."""
    received: list[dict[str, Any]] = []
    done = anyio.Event()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = FrameReader(stream)
            received.extend([await reader.read() for _ in range(20)])
            done.set()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        client = await anyio.connect_tcp("127.0.0.1", port)
        async with client:
            writer = FrameWriter(client)
            for n in range(20):
                await writer.send_frame({"n": n, "pad": "z" * 5000})
            with anyio.fail_after(5):
                await done.wait()
        tg.cancel_scope.cancel()
    assert [f["n"] for f in received] == list(range(20))


async def _socket_pair() -> tuple[anyio.abc.SocketStream, anyio.abc.SocketStream]:
    import socket

    a, b = socket.socketpair()
    return (
        await anyio.abc.UNIXSocketStream.from_socket(a),
        await anyio.abc.UNIXSocketStream.from_socket(b),
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(
    objs=st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=5), max_size=5),
    cuts=st.lists(st.integers(1, 40), max_size=10),
)
def test_frames_round_trip_whatever_the_chunking(
    objs: list[dict[str, object]], cuts: list[int]
) -> None:
    """Any sequence of JSON objects survives encode → arbitrary chunking → FrameReader."""
    data = b"".join(encode_frame(o) for o in objs)
    chunks: list[bytes] = []
    rest = data
    for cut in cuts:
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks.append(rest)

    async def run() -> list[dict[str, object]]:
        reader = FrameReader(ChunkStream(chunks))
        return [await reader.read() for _ in objs]

    assert anyio.run(run) == objs


def test_decode_body_accepts_memoryview() -> None:
    """decode_body takes bytes-like bodies."""
    assert decode_body(memoryview(b'{"k": [1]}')) == {"k": [1]}


async def test_read_body_returns_the_undecoded_body() -> None:
    """FrameReader.read_body hands out body bytes one frame at a time (size checks apply)."""

    class _Bytes(ByteReceiveStream):
        def __init__(self, data: bytes) -> None:
            self._data = data

        async def receive(self, max_bytes: int = 65536) -> bytes:
            if not self._data:
                raise anyio.EndOfStream
            chunk, self._data = self._data[:max_bytes], self._data[max_bytes:]
            return chunk

        async def aclose(self) -> None:
            pass

    reader = FrameReader(_Bytes(encode_frame({"a": 1}) + encode_frame([1])), max_bytes=64)
    assert await reader.read_body() == b'{"a":1}'
    assert await reader.read_body() == b"[1]"
    with pytest.raises(anyio.EndOfStream):
        await reader.read_body()
