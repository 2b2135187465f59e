"""Fuzz: the frame decoder on random byte streams, split at random points."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.wire.frames import (
    FrameDecodeError,
    FrameError,
    FrameReader,
    decode_body,
    encode_frame,
    read_frame,
)

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class _Chunks(anyio.abc.ByteReceiveStream):
    """A byte stream that hands out the given chunks, then ends."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = [c for c in chunks if c]

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        chunk = self._chunks.pop(0)
        if len(chunk) > max_bytes:
            self._chunks.insert(0, chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        return chunk

    async def aclose(self) -> None:
        self._chunks = []


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


streams = st.lists(
    st.binary(max_size=40)
    | st.binary(max_size=60).map(_frame)
    | st.sampled_from([b'{"type":"heartbeat"}', b"{}", b"[]", b'"x"', b"\xff\xfe"]).map(_frame)
    | st.just(encode_frame({"id": 1, "op": "ping"})),
    max_size=6,
)


async def _drain(data: bytes, cut: list[int], bare: bool) -> int:
    pieces, last = [], 0
    for point in sorted(set(cut)):
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    stream = _Chunks(pieces)
    reader = FrameReader(stream, max_bytes=4096)
    frames = 0
    while True:
        try:
            with anyio.fail_after(5):
                if bare:
                    await read_frame(stream, max_bytes=4096)
                else:
                    await reader.read()
        except anyio.EndOfStream:
            return frames
        except FrameError:
            return frames  # documented: the connection is closed
        frames += 1


def test_reader_on_random_streams(record: Callable[..., None]) -> None:
    """FrameReader and read_frame: frames, FrameError or EndOfStream, never a hang."""
    count = 0

    @settings(FUZZ, max_examples=500)
    @given(streams, st.lists(st.integers(min_value=0, max_value=400), max_size=5), st.booleans())
    def run(parts: list[bytes], cut: list[int], bare: bool) -> None:
        nonlocal count
        count += 1
        anyio.run(_drain, b"".join(parts), cut, bare)

    run()
    record("frames: reader on random streams", count, minimum=300)


def test_decode_body_on_random_bytes(record: Callable[..., None]) -> None:
    """decode_body: a dict or FrameDecodeError."""
    count = 0

    @settings(FUZZ, max_examples=1000)
    @given(st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
    def run(body: bytes) -> None:
        nonlocal count
        count += 1
        with contextlib.suppress(FrameDecodeError):
            assert isinstance(decode_body(body), dict)

    run()
    record("frames: decode_body", count, minimum=700)
