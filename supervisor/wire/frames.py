"""Length-prefixed JSON frames: the wire format of ``executors.sock`` and ``control.sock``.

A frame is a 4-byte big-endian unsigned length N followed by N bytes of UTF-8 JSON whose top
level is an object. N counts the body only (not the header), must be at least 2 (``{}``) and at
most the reader's ``max_bytes``. ``docs/protocol.md`` is the normative description.

Design notes: the header and the body go out in one ``send`` call (one syscall, no interleaving
with other writers that hold the same lock); the reader keeps its own buffer so that several
frames arriving in one TCP/Unix read are decoded without extra receive calls. A frame that is too
large is refused as soon as its header is read, before any of its body is buffered.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec
import orjson
from anyio.abc import ByteReceiveStream, ByteSendStream, SocketAttribute

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER_SIZE",
    "FrameDecodeError",
    "FrameError",
    "FrameReader",
    "FrameTooLarge",
    "FrameTruncated",
    "FrameWriter",
    "decode_body",
    "encode_frame",
    "frame_of",
    "read_frame",
    "undecodable",
    "write_frame",
]

#: Default maximum body size in bytes (1 MiB), the daemon's ``max_frame_bytes`` default.
DEFAULT_MAX_FRAME_BYTES: Final = 1_048_576
#: Size of the length prefix.
HEADER_SIZE: Final = 4
_HEADER: Final = struct.Struct(">I")
_RECEIVE_CHUNK: Final = 65_536
_MIN_BODY: Final = 2  # the shortest JSON object, "{}"
_YIELD_EVERY: Final = 64  # fast-path socket operations between forced checkpoints
_CORK_WINDOW_S: Final = 200e-6  # a send this soon after the previous one is batched


def _raw_socket(stream: object) -> socket.socket | None:
    """The socket under ``stream`` when reading/writing it directly is safe, else ``None``.

    Only anyio's asyncio Unix socket stream qualifies: it drives a plain non-blocking socket
    with no buffer of its own. (anyio's asyncio TCP streams sit on a transport that owns the
    socket: bypassing it would lose or reorder bytes.)
    """
    kind = type(stream)
    if kind.__name__ != "UNIXSocketStream" or kind.__module__ != "anyio._backends._asyncio":
        return None
    extra = getattr(stream, "extra", None)
    sock = extra(SocketAttribute.raw_socket, None) if extra is not None else None
    if not isinstance(sock, socket.socket) or sock.family != socket.AF_UNIX:
        return None
    return sock


class FrameError(Exception):
    """Raised when bytes on a stream are not a valid frame; ``reason`` says why.

    The connection the frame came from is unusable afterwards (the reader cannot resynchronise),
    so the caller closes it. Subclasses name the three ways a frame goes wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class FrameTooLarge(FrameError):
    """Raised when a frame's declared (or, on encode, actual) body length exceeds ``max_bytes``.

    ``size`` is the declared length and ``max_bytes`` the limit in force.
    """

    def __init__(self, *, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        super().__init__(f"frame of {size} bytes exceeds the {max_bytes}-byte limit")


class FrameTruncated(FrameError):
    """Raised when the stream ends in the middle of a frame (header or body incomplete).

    ``received`` is how many bytes of the frame (header included) had arrived, ``expected`` how
    many were announced (``None`` when even the header was incomplete).
    """

    def __init__(self, *, received: int, expected: int | None) -> None:
        self.received = received
        self.expected = expected
        wanted = "a 4-byte header" if expected is None else f"{expected} bytes"
        super().__init__(f"stream ended after {received} bytes of a frame ({wanted} expected)")


class FrameDecodeError(FrameError):
    """Raised when a frame body is not UTF-8 JSON whose top level is an object."""


def undecodable(exc: BaseException) -> FrameDecodeError:
    """The `FrameDecodeError` for whatever a decoder raised on a body (the one place that words
    it): a body that fails to decode is a bad frame, whatever the exception's type. msgspec
    raises ``UnicodeDecodeError`` (a ``ValueError``), not its ``DecodeError``, for a string that
    holds bytes that are not UTF-8, and ``RecursionError`` for nesting too deep."""
    if isinstance(exc, FrameDecodeError):
        return exc
    if isinstance(exc, UnicodeError):
        return FrameDecodeError(
            f"frame body is not valid UTF-8 JSON: a string holds bytes that are not UTF-8 ({exc})"
        )
    if isinstance(exc, RecursionError):
        return FrameDecodeError("frame body is JSON nested too deep")
    if isinstance(exc, msgspec.DecodeError | orjson.JSONDecodeError):
        return FrameDecodeError(f"frame body is not valid UTF-8 JSON: {exc}")
    return FrameDecodeError(f"frame body cannot be decoded: {type(exc).__name__}: {exc}")


def encode_frame(obj: object, *, max_bytes: int | None = None) -> bytes:
    """Return the frame (header + orjson body) for ``obj``.

    Raises ``FrameTooLarge`` when ``max_bytes`` is given and the body exceeds it, and
    ``TypeError`` when ``obj`` is not JSON-serialisable by orjson.
    """
    body = orjson.dumps(obj)
    size = len(body)
    if max_bytes is not None and size > max_bytes:
        raise FrameTooLarge(size=size, max_bytes=max_bytes)
    return _HEADER.pack(size) + body


def frame_of(*parts: bytes) -> bytes:
    """The frame whose body is the concatenation of *parts* (already encoded JSON pieces)."""
    return _HEADER.pack(sum(map(len, parts))) + b"".join(parts)


def decode_body(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode one frame body; raises ``FrameDecodeError`` unless it is a JSON object."""
    try:
        obj = orjson.loads(body)
    except Exception as exc:  # JSONDecodeError, and anything unforeseen: a bad frame
        raise undecodable(exc) from None
    if not isinstance(obj, dict):
        raise FrameDecodeError(f"frame body is a JSON {type(obj).__name__}, not an object")
    return obj


class FrameReader:
    """Reads frames from a byte stream, keeping the bytes that belong to the next frame.

    ``read()`` returns the next frame's object; raises ``anyio.EndOfStream`` when the peer closed
    the stream cleanly between frames, ``FrameTruncated`` when it closed mid-frame,
    ``FrameTooLarge`` / ``FrameDecodeError`` for a bad frame, and passes through
    ``anyio.BrokenResourceError`` / ``anyio.ClosedResourceError`` from the stream.

    On an asyncio Unix socket it reads the socket itself (see `_fill`): stop the task that
    reads (cancel it) before closing the stream, as every reader of this product does.
    """

    __slots__ = ("_buffer", "_fast", "_sock", "_stream", "max_bytes")

    def __init__(self, stream: ByteReceiveStream, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self._stream = stream
        self._buffer = bytearray()
        self._sock = _raw_socket(stream)
        self._fast = 0
        self.max_bytes = max_bytes

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    async def read(self) -> dict[str, Any]:
        """Return the next frame's JSON object (see the class docstring for errors)."""
        return decode_body(await self.read_body())

    async def read_body(self) -> bytes:
        """Return the next frame's body bytes, undecoded (for one-step typed decoders such as
        ``supervisor.wire.control.decode_request``). Size errors are raised as by ``read``; the
        caller decodes the body and so owns ``FrameDecodeError``."""
        buf = self._buffer
        while len(buf) < HEADER_SIZE:
            await self._fill(expected=None)
        (size,) = _HEADER.unpack_from(buf)
        if size > self.max_bytes:
            raise FrameTooLarge(size=size, max_bytes=self.max_bytes)
        if size < _MIN_BODY:
            raise FrameDecodeError(f"frame body of {size} bytes cannot hold a JSON object")
        end = HEADER_SIZE + size
        while len(buf) < end:
            await self._fill(expected=end)
        if len(buf) == end:
            body = bytes(buf[HEADER_SIZE:])
            buf.clear()
        else:
            body = bytes(buf[HEADER_SIZE:end])
            del buf[:end]
        return body

    async def _fill(self, *, expected: int | None) -> None:
        sock = self._sock
        if sock is None:
            try:
                chunk = await self._stream.receive(_RECEIVE_CHUNK)
            except anyio.EndOfStream:
                self._eof(expected)
            self._buffer += chunk
            return
        # The socket read directly: bytes already queued in the kernel are taken without a
        # trip through the event loop, and a wait for more registers the descriptor (an int)
        # with the loop. anyio's receive would yield once first, then register the socket
        # object, whose repr asyncio formats for a KeyError it catches on every registration
        # (4% of a busy daemon's CPU), and whose late callback could meet a cancelled read
        # (`loop_callback_race`): `anyio.wait_readable` does neither. The one rule it adds:
        # stop a reader before closing its socket (a wait on a descriptor closed under it
        # stays registered under that number until the reader is cancelled).
        if self._fast >= _YIELD_EVERY:  # a peer that never pauses: let the others run
            self._fast = 0
            await anyio.lowlevel.checkpoint()
        while True:
            try:
                chunk = sock.recv(_RECEIVE_CHUNK)
            except (BlockingIOError, InterruptedError):
                fd = sock.fileno()
                if fd >= 0:
                    try:
                        await anyio.wait_readable(fd)
                    except anyio.BusyResourceError:
                        # The number is still registered for a socket closed while it was
                        # read (its reader must be stopped first): wait the stream's way.
                        chunk = b""
                    except OSError as exc:  # the loop could not register it: a broken read
                        raise anyio.BrokenResourceError from exc
                    else:
                        continue
                else:
                    chunk = b""  # closed meanwhile: the stream raises its own error
            except OSError:  # closed or broken: the stream raises its own error
                chunk = b""
            if chunk:
                break
            try:
                chunk = await self._stream.receive(_RECEIVE_CHUNK)
            except anyio.EndOfStream:
                self._eof(expected)
            break
        if not chunk:
            self._eof(expected)
        self._fast += 1
        self._buffer += chunk

    def _eof(self, expected: int | None) -> None:
        if self._buffer:
            raise FrameTruncated(received=len(self._buffer), expected=expected) from None
        raise anyio.EndOfStream


class FrameWriter:
    """Sends frames on a byte stream, whole frames only, safe for concurrent writers.

    Two modes:

    * Direct (default): a frame the kernel accepts at once is written straight to the socket
      (no event-loop round trip); anything else goes through the stream under a lock, so frames
      never interleave.
    * Corked, while ``run()`` is running in a task: a corked send (see ``send``) only queues the
      frame and wakes ``run()``, which writes everything queued during one event-loop pass with
      a single syscall; an uncorked send is written at once, so a lone request pays no extra
      latency. On this machine a Unix-socket send that wakes
      the peer costs ~45 µs, so under load corking divides the syscalls (and the peer's
      wake-ups) by the batch size. ``send()``
      waits only when more than ``high_water`` bytes are queued (backpressure).

    Errors are the stream's: ``anyio.BrokenResourceError`` when the peer is gone,
    ``anyio.ClosedResourceError`` after ``aclose``. In corked mode a write error ends ``run()``
    and is raised by the next ``send()``.
    """

    __slots__ = (
        "_busy",
        "_chunks",
        "_drained",
        "_error",
        "_fast",
        "_high_water",
        "_last",
        "_lock",
        "_queued",
        "_running",
        "_sock",
        "_stream",
        "_wakeup",
    )

    def __init__(self, stream: ByteSendStream, *, high_water: int = 4 * 1024 * 1024) -> None:
        self._stream = stream
        self._sock = _raw_socket(stream)
        self._lock = anyio.Lock(fast_acquire=True)
        self._fast = 0
        self._high_water = high_water
        self._chunks: list[bytes] = []
        self._queued = 0
        self._running = False
        self._busy = False
        self._wakeup = anyio.Event()
        self._drained = anyio.Event()
        self._error: Exception | None = None
        self._last = 0.0

    async def send(self, data: bytes, *, cork: bool | None = None) -> None:
        """Send ``data`` (one or more complete frames) without interleaving with other sends.

        ``cork`` (corked mode only): True queues the data for the next batch, False writes it
        at once (after anything already queued), None decides by time: a send within 200 µs of
        the previous one is queued. Callers that know more traffic is coming (the hub with
        several instructions in flight on a connection) pass True.
        """
        if self._error is not None:
            raise self._error
        if not self._running:
            await self._write(data)
            return
        now = time.monotonic()
        if cork is None:
            cork = now - self._last <= _CORK_WINDOW_S
        self._last = now
        if not cork and not self._chunks and not self._busy:
            await self._write(data)
            return
        self._chunks.append(data)
        self._queued += len(data)
        self._wakeup.set()
        if self._queued > self._high_water:
            await self._drained.wait()
            if self._error is not None:
                raise self._error

    def send_nowait(self, data: bytes, *, cork: bool, last: bool = False) -> bool:
        """`send` without waiting (corked mode only), for callers that are not tasks: written
        at once when nothing is queued and ``cork`` is false (what the kernel does not take
        is queued), else queued for the writer's next batch. False, with nothing sent, when
        the writer is not running, has failed, or holds more than ``high_water`` bytes: the
        caller sends with `send` from a task instead. ``last``: queue it even past
        ``high_water`` (one small closing frame, e.g. why a stream was cut off)."""
        if self._error is not None or not self._running:
            return False
        if self._queued > self._high_water and not last:
            return False
        sock = self._sock
        direct = not cork and sock is not None and not self._chunks and not self._busy
        if direct and sock is not None and not self._lock.locked():
            try:
                sent = sock.send(data)
            except OSError:  # would block, or broken: the writer's task meets the error
                sent = 0
            if sent == len(data):
                return True
            data = data[sent:]
        self._chunks.append(data)
        self._queued += len(data)
        self._wakeup.set()
        return True

    @property
    def queued(self) -> int:
        """Bytes handed to the writer and not yet to the kernel (corked mode)."""
        return self._queued

    async def send_frame(self, obj: object, *, max_bytes: int | None = None) -> None:
        """Encode ``obj`` as a frame and send it."""
        await self.send(encode_frame(obj, max_bytes=max_bytes))

    async def flush(self) -> None:
        """Wait until every queued frame has been handed to the kernel (corked mode)."""
        while self._running and (self._chunks or self._busy):
            await self._drained.wait()
        if self._error is not None:
            raise self._error

    async def run(self) -> None:
        """Corked mode: write queued frames in batches until cancelled or the stream breaks."""
        self._running = True
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                self._busy = True
                while self._chunks:
                    chunks, self._chunks, self._queued = self._chunks, [], 0
                    await self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                self._busy = False
                self._drained.set()
                self._drained = anyio.Event()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._error = exc
            self._drained.set()
        finally:
            self._running = False
            self._busy = False
            self._drained.set()

    async def _write(self, data: bytes) -> None:
        sock = self._sock
        if sock is not None and not self._lock.locked() and self._fast < _YIELD_EVERY:
            try:
                sent = sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                sent = 0  # the stream below raises the matching anyio error
            self._fast += 1
            if sent == len(data):
                return
            data = data[sent:]
        self._fast = 0
        async with self._lock:
            await self._stream.send(data)


async def read_frame(
    stream: ByteReceiveStream | FrameReader, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> dict[str, Any]:
    """Read one frame from ``stream``.

    With a ``FrameReader`` this is ``reader.read()`` (buffered, its own ``max_bytes`` applies).
    With a bare byte stream it never reads past the end of the frame (it asks the stream for
    exactly the bytes still missing), so it can be mixed with other readers of the same stream;
    prefer a ``FrameReader`` on hot paths. Errors are those of ``FrameReader.read``.
    """
    if isinstance(stream, FrameReader):
        return await stream.read()
    header = await _receive_exactly(stream, HEADER_SIZE, expected=None, have=0)
    (size,) = _HEADER.unpack(header)
    if size > max_bytes:
        raise FrameTooLarge(size=size, max_bytes=max_bytes)
    if size < _MIN_BODY:
        raise FrameDecodeError(f"frame body of {size} bytes cannot hold a JSON object")
    body = await _receive_exactly(stream, size, expected=HEADER_SIZE + size, have=HEADER_SIZE)
    return decode_body(body)


async def _receive_exactly(
    stream: ByteReceiveStream, count: int, *, expected: int | None, have: int
) -> bytes:
    parts = bytearray()
    while len(parts) < count:
        try:
            parts += await stream.receive(count - len(parts))
        except anyio.EndOfStream:
            if parts or have:
                raise FrameTruncated(received=have + len(parts), expected=expected) from None
            raise
    return bytes(parts)


async def write_frame(stream: ByteSendStream, obj: object, *, max_bytes: int | None = None) -> None:
    """Encode ``obj`` and send it as one frame with a single ``send`` call."""
    await stream.send(encode_frame(obj, max_bytes=max_bytes))
