"""The frame side of one executor connection: ``Link``.

A ``Link`` owns the socket's two directions and the liveness they prove: the ``FrameWriter``
out, the read loop over the ``FrameReader`` in (each frame decoded straight into its typed
message), the time of the last frame read, and the heartbeats (one out every
``heartbeat_interval_s``; silence for ``heartbeat_misses`` intervals ends the connection). What a
message means — a response to judge, a status to take — is its connection's business, reached
through ``LinkOwner``.

It is apart from ``connection`` because framing and liveness change for other reasons (the wire
protocol, the heartbeat rules) than the attempts in flight do. The read loop binds its owner's
handlers once, so a frame read costs no more calls or look-ups than when they were one class.
"""

from __future__ import annotations

import time
from typing import Final, Never, Protocol

import anyio
import anyio.abc

from supervisor.executors.clock import ms, now_us
from supervisor.executors.host import ConnectionHost
from supervisor.executors.judge import Verdict, bad_frame, protocol_breach
from supervisor.executors.log import EventLog
from supervisor.executors.reports import HubReason
from supervisor.wire.executor import (
    Heartbeat,
    MessageError,
    MessageType,
    ResponseMessage,
    Status,
    decode_executor_message,
)
from supervisor.wire.frames import (
    FrameDecodeError,
    FrameError,
    FrameReader,
    FrameTooLarge,
    FrameTruncated,
    FrameWriter,
    encode_frame,
)

__all__ = ["Link", "LinkOwner"]

_LOST: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class LinkOwner(Protocol):
    """What a ``Link`` needs of the connection it carries frames for."""

    @property
    def executor_id(self) -> str:
        """The executor's id (every event names it)."""

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (the read loop stops)."""

    @property
    def in_flight_count(self) -> int:
        """Attempts in flight (a missed heartbeat's event counts them)."""

    def disconnect(self, reason: str, detail: str) -> None:
        """Close the connection (heartbeats missed, a send failed)."""

    def response_received(self, body: object, evidence: object = None) -> None:
        """A ``response`` came: attribute and judge it."""

    def status_received(self, status: Status) -> None:
        """A ``status`` came: the executor's own view of its state."""

    def fail_in_flight(self, verdict: Verdict) -> None:
        """End what is in flight with *verdict*; the connection closes next."""

    def frame_failed(self, exc: FrameError) -> None:
        """A frame could not be read (counted and logged by the hub)."""


class Link:
    """The writer, the read loop and the heartbeats of one connection."""

    __slots__ = ("_host", "_log", "_owner", "last_rx", "writer")

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        *,
        owner: LinkOwner,
        host: ConnectionHost[Never],
        log: EventLog,
    ) -> None:
        # ``Never``: any host (the link only reads its settings)
        self.writer = FrameWriter(stream)
        self._owner = owner
        self._host = host
        self._log = log
        #: when the last frame was read (``time.monotonic``): the proof of liveness
        self.last_rx = time.monotonic()

    async def heartbeats(self) -> None:
        """Send a heartbeat every interval; close the connection after a silence too long."""
        settings = self._host.settings
        interval = settings.heartbeat_interval_s
        limit = interval * settings.heartbeat_misses
        owner = self._owner
        while True:
            await anyio.sleep(interval)
            silent = time.monotonic() - self.last_rx
            if silent > limit:
                self._log.warning(
                    "heartbeat_missed",
                    executor_id=owner.executor_id,
                    silent_ms=ms(silent),
                    limit_ms=ms(limit),
                    in_flight=owner.in_flight_count,
                )
                owner.disconnect(
                    HubReason.HEARTBEAT_LOST,
                    f"no frame for {silent:.1f}s (limit {limit:g}s): executor OFFLINE",
                )
                return
            try:
                with anyio.move_on_after(limit):
                    await self.writer.send(encode_frame(Heartbeat(ts_us=now_us()).to_wire()))
            except _LOST as exc:
                owner.disconnect(HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
                return

    async def read(self, reader: FrameReader) -> tuple[str, str]:
        """Read frames until the connection ends; returns (reason code, detail)."""
        owner = self._owner
        on_response, on_status = owner.response_received, owner.status_received
        try:
            while True:
                body = await reader.read_body()
                self.last_rx = time.monotonic()
                try:
                    message = decode_executor_message(body)  # one step: typed and checked
                except MessageError as exc:
                    if exc.message_type == MessageType.HEARTBEAT:
                        continue  # a heartbeat only proves liveness, whatever it carries
                    if exc.message_type == MessageType.STATUS:
                        self._log.warning(
                            "status_rejected", executor_id=owner.executor_id, reason=exc.reason
                        )
                        continue
                    detail = exc.reason
                    self._protocol_breach(detail)
                    return HubReason.PROTOCOL_ERROR, detail
                if isinstance(message, ResponseMessage):
                    on_response(message.response, message.evidence)
                elif isinstance(message, Status):
                    on_status(message)
                if owner.closed:
                    return HubReason.EXECUTOR_QUARANTINED, "closed by the hub"
        except anyio.EndOfStream:
            return HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        except FrameTruncated as exc:
            owner.frame_failed(exc)
            return HubReason.EXECUTOR_DISCONNECTED, exc.reason
        except (FrameTooLarge, FrameDecodeError) as exc:
            owner.frame_failed(exc)
            owner.fail_in_flight(bad_frame(exc.reason))
            return HubReason.FRAME_ERROR, exc.reason
        except _LOST as exc:
            return HubReason.EXECUTOR_DISCONNECTED, f"connection lost: {exc!r}"

    def _protocol_breach(self, detail: str) -> None:
        self._log.warning(
            "response_rejected",
            executor_id=self._owner.executor_id,
            detail=detail,
            reason_code=HubReason.PROTOCOL_ERROR,
        )
        self._owner.fail_in_flight(protocol_breach(detail))
