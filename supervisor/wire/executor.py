"""Messages of the executor protocol (``executors.sock``) and their validation.

Every frame (see ``supervisor.wire.frames``) carries one JSON object with a ``"type"`` key
naming the message. This module holds one frozen dataclass per message, ``to_wire()`` methods
producing the exact dicts that go over the wire, and ``parse_*`` functions that turn an
untrusted dict into a message or raise ``ProtocolError`` with a stable ``reason_code``.
``docs/protocol.md`` is the normative description; keep the two in step.

Frames read off a socket are decoded in one step by ``decode_hello`` (the first frame) and
``decode_executor_message`` (everything after it): msgspec Structs check every type and
constraint while decoding the body bytes, so a message that decodes is valid. The Structs accept
exactly what the ``parse_*`` functions accept (the fuzz tests check that); when a body does not
decode, the matching ``parse_*`` function explains why, so the ``reason_code`` and wording of a
``ProtocolError`` are the same on both paths.

Responses are the exception: the daemon hands the raw ``response`` object to the Phase-20 safety
rules (``sandbox.policy.safety.validate_executor_response``) unchanged, because deciding whether
a response is well formed, lies or claims authority is the policy core's job. The same goes for
the ``evidence`` beside it (base64 of the evidence bytes, at most ``MAX_EVIDENCE_BYTES``): a bad
one fails that one attempt (``supervisor.executors.judge``), not the connection."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeAlias

import msgspec
from msgspec import Meta

from sandbox.policy import safety
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorStatus,
)
from sandbox.policy.errors import InstructionError
from sandbox.policy.safety import instruction_from_wire
from supervisor.errors import ProtocolError
from supervisor.wire.frames import decode_body

__all__ = [
    "MAX_EVIDENCE_BYTES",
    "MAX_RETRY_AFTER_MS",
    "MAX_SLOTS",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "Cancel",
    "ExecutorMessage",
    "Heartbeat",
    "Hello",
    "MessageError",
    "MessageType",
    "ProtocolError",
    "Reject",
    "RejectReason",
    "ResponseMessage",
    "Status",
    "Welcome",
    "decode_executor_message",
    "decode_hello",
    "instruction_message",
    "parse_cancel",
    "parse_heartbeat",
    "parse_hello",
    "parse_instruction",
    "parse_reject",
    "parse_status",
    "parse_welcome",
    "response_message",
]

#: The protocol version this daemon and SDK speak.
PROTOCOL_VERSION: Final = 1
#: Versions the daemon accepts in ``hello``.
SUPPORTED_VERSIONS: Final[frozenset[int]] = frozenset({PROTOCOL_VERSION})
#: Upper bound on the ``slots`` an executor may declare.
MAX_SLOTS: Final = 1024
#: Upper bound on the evidence bytes a ``response`` may carry (base64 in its ``evidence``
#: field: about 683 KiB of text, within the default 1 MiB frame).
MAX_EVIDENCE_BYTES: Final = 512 * 1024
#: Upper bound on a response's ``retry_after_ms`` (one hour). Checked with the other Phase-20
#: response rules (``validate_executor_response``); named here for executors.
MAX_RETRY_AFTER_MS: Final = safety.MAX_RETRY_AFTER_MS
_EXECUTOR_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_MAX_TEXT: Final = 4096


class MessageType:
    """The ``"type"`` strings of the protocol's messages."""

    HELLO: Final = "hello"
    WELCOME: Final = "welcome"
    REJECT: Final = "reject"
    INSTRUCTION: Final = "instruction"
    RESPONSE: Final = "response"
    HEARTBEAT: Final = "heartbeat"
    CANCEL: Final = "cancel"
    STATUS: Final = "status"


class RejectReason:
    """Stable ``reason_code`` values of ``reject`` messages and ``ProtocolError``."""

    UNSUPPORTED_VERSION: Final = "UNSUPPORTED_VERSION"
    DUPLICATE_EXECUTOR_ID: Final = "DUPLICATE_EXECUTOR_ID"
    QUARANTINED: Final = "QUARANTINED"
    UID_NOT_ALLOWED: Final = "UID_NOT_ALLOWED"
    BAD_HELLO: Final = "BAD_HELLO"
    HELLO_TIMEOUT: Final = "HELLO_TIMEOUT"
    HUB_CLOSING: Final = "HUB_CLOSING"
    BAD_MESSAGE: Final = "BAD_MESSAGE"


@dataclass(frozen=True, slots=True)
class Hello:
    """Executor → daemon, first message: who the executor is and what it can do."""

    executor_id: str
    protocol_version: int
    commands: tuple[ExecutorCommandType, ...]
    slots: int = 1
    software: str = ""

    def to_wire(self) -> dict[str, object]:
        return {
            "type": MessageType.HELLO,
            "executor_id": self.executor_id,
            "protocol_version": self.protocol_version,
            "commands": [c.value for c in self.commands],
            "slots": self.slots,
            "software": self.software,
        }


@dataclass(frozen=True, slots=True)
class Welcome:
    """Daemon → executor: the hello was accepted; the limits the daemon will enforce."""

    executor_id: str
    protocol_version: int
    heartbeat_interval_ms: int
    heartbeat_misses: int
    max_frame_bytes: int

    def to_wire(self) -> dict[str, object]:
        return {
            "type": MessageType.WELCOME,
            "executor_id": self.executor_id,
            "protocol_version": self.protocol_version,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "heartbeat_misses": self.heartbeat_misses,
            "max_frame_bytes": self.max_frame_bytes,
        }


@dataclass(frozen=True, slots=True)
class Reject:
    """Daemon → executor: the connection is refused; the daemon closes it after sending this."""

    reason_code: str
    reason: str
    retry_after_ms: int | None = None
    supported_versions: tuple[int, ...] = field(default=tuple(sorted(SUPPORTED_VERSIONS)))

    def to_wire(self) -> dict[str, object]:
        return {
            "type": MessageType.REJECT,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "retry_after_ms": self.retry_after_ms,
            "supported_versions": list(self.supported_versions),
        }


#: The integers a heartbeat's ``ts_us`` may hold: a signed 64-bit integer, as every clock in
#: microseconds is; past that a number is no clock reading, and the heartbeat is ignored.
_TS_MIN: Final = -(2**63)
_TS_MAX: Final = 2**63 - 1


class Heartbeat(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.HEARTBEAT):
    """Either direction: I am alive. ``ts_us`` is the sender's wall clock (informative; 0 when
    absent). A msgspec Struct: ``decode_executor_message`` decodes it in one step."""

    ts_us: Annotated[int, Meta(ge=_TS_MIN, le=_TS_MAX)] = 0

    def to_wire(self) -> dict[str, object]:
        return {"type": MessageType.HEARTBEAT, "ts_us": self.ts_us}


@dataclass(frozen=True, slots=True)
class Cancel:
    """Daemon → executor: stop working on ``instruction_id`` and answer it at once."""

    instruction_id: str
    reason: str = "deadline"

    def to_wire(self) -> dict[str, object]:
        return {
            "type": MessageType.CANCEL,
            "instruction_id": self.instruction_id,
            "reason": self.reason,
        }


class Status(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.STATUS):
    """Executor → daemon: the executor's own view of whether it takes new work. A msgspec
    Struct: ``decode_executor_message`` decodes it in one step (``detail`` at most 4096
    characters)."""

    status: ExecutorStatus
    detail: Annotated[str, Meta(max_length=_MAX_TEXT)] = ""

    def to_wire(self) -> dict[str, object]:
        return {"type": MessageType.STATUS, "status": self.status.value, "detail": self.detail}


def instruction_message(
    wire_envelope: Mapping[str, object], *, traceparent: str | None = None
) -> dict[str, object]:
    """Daemon → executor: the ``instruction`` message around an envelope's wire dict, with the
    attempt's W3C ``traceparent`` beside it when traces are on (an executor may continue the
    trace; the envelope itself is the seed's, unchanged)."""
    message: dict[str, object] = {"type": MessageType.INSTRUCTION, "instruction": wire_envelope}
    if traceparent is not None:
        message["traceparent"] = traceparent
    return message


def response_message(
    wire_response: Mapping[str, object], *, evidence: bytes | None = None
) -> dict[str, object]:
    """Executor → daemon: the ``response`` message around a response envelope's wire dict,
    with the evidence bytes (base64) when given."""
    message: dict[str, object] = {"type": MessageType.RESPONSE, "response": wire_response}
    if evidence is not None:
        message["evidence"] = base64.b64encode(evidence).decode("ascii")
    return message


# --- parsing -------------------------------------------------------------------------------


def _bad(field_name: str, problem: str, code: str = RejectReason.BAD_MESSAGE) -> ProtocolError:
    return ProtocolError(code, f"field {field_name!r} {problem}")


def _int(obj: Mapping[str, Any], key: str, code: str, *, low: int, high: int) -> int:
    value = obj.get(key)
    if type(value) is not int:
        raise _bad(key, f"must be an integer, got {type(value).__name__}", code)
    if not low <= value <= high:
        raise _bad(key, f"must be between {low} and {high}, got {value}", code)
    return value


def _text(obj: Mapping[str, Any], key: str, code: str, *, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise _bad(key, f"must be a string, got {type(value).__name__}", code)
    if len(value) > _MAX_TEXT:
        raise _bad(key, f"must be at most {_MAX_TEXT} characters", code)
    return value


def _expect_type(obj: Mapping[str, Any], expected: str) -> None:
    kind = obj.get("type")
    if kind != expected:
        raise ProtocolError(
            RejectReason.BAD_MESSAGE, f"expected a {expected!r} message, got type {kind!r}"
        )


def parse_hello(obj: Mapping[str, Any]) -> Hello:
    """Validate a ``hello``; ``ProtocolError`` reason codes: BAD_HELLO, UNSUPPORTED_VERSION."""
    code = RejectReason.BAD_HELLO
    if obj.get("type") != MessageType.HELLO:
        raise ProtocolError(code, f"the first message must be 'hello', got {obj.get('type')!r}")
    version = obj.get("protocol_version")
    if type(version) is not int:
        raise _bad("protocol_version", "must be an integer", code)
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            RejectReason.UNSUPPORTED_VERSION,
            f"protocol version {version} is not supported (supported: "
            f"{', '.join(str(v) for v in sorted(SUPPORTED_VERSIONS))})",
        )
    executor_id = obj.get("executor_id")
    if not isinstance(executor_id, str) or _EXECUTOR_ID.fullmatch(executor_id) is None:
        raise _bad(
            "executor_id",
            "must be 1-128 characters of [A-Za-z0-9._:@-] starting with a letter or digit",
            code,
        )
    raw_commands = obj.get("commands")
    if not isinstance(raw_commands, list) or not raw_commands:
        raise _bad("commands", "must be a non-empty list of command type names", code)
    commands: list[ExecutorCommandType] = []
    for item in raw_commands:
        try:
            command = ExecutorCommandType(item)
        except ValueError:
            raise _bad("commands", f"names an unknown command type {item!r}", code) from None
        if command in commands:
            raise _bad("commands", f"lists {command.value} twice", code)
        commands.append(command)
    slots = _int(obj, "slots", code, low=1, high=MAX_SLOTS) if "slots" in obj else 1
    software = _text(obj, "software", code, default="")
    return Hello(
        executor_id=executor_id,
        protocol_version=version,
        commands=tuple(commands),
        slots=slots,
        software=software,
    )


def parse_welcome(obj: Mapping[str, Any]) -> Welcome:
    """Validate a ``welcome`` (SDK side)."""
    _expect_type(obj, MessageType.WELCOME)
    code = RejectReason.BAD_MESSAGE
    executor_id = _text(obj, "executor_id", code)
    return Welcome(
        executor_id=executor_id,
        protocol_version=_int(obj, "protocol_version", code, low=1, high=2**31),
        heartbeat_interval_ms=_int(obj, "heartbeat_interval_ms", code, low=1, high=2**31),
        heartbeat_misses=_int(obj, "heartbeat_misses", code, low=1, high=2**31),
        max_frame_bytes=_int(obj, "max_frame_bytes", code, low=2, high=2**32 - 1),
    )


def parse_reject(obj: Mapping[str, Any]) -> Reject:
    """Validate a ``reject`` (SDK side)."""
    _expect_type(obj, MessageType.REJECT)
    code = RejectReason.BAD_MESSAGE
    retry = obj.get("retry_after_ms")
    if retry is not None and (type(retry) is not int or retry < 0):
        raise _bad("retry_after_ms", "must be null or a non-negative integer", code)
    versions = obj.get("supported_versions", [])
    if not isinstance(versions, list) or not all(type(v) is int for v in versions):
        raise _bad("supported_versions", "must be a list of integers", code)
    return Reject(
        reason_code=_text(obj, "reason_code", code),
        reason=_text(obj, "reason", code, default=""),
        retry_after_ms=retry,
        supported_versions=tuple(versions),
    )


def parse_heartbeat(obj: Mapping[str, Any]) -> Heartbeat:
    """Validate a ``heartbeat`` (``ts_us`` optional, 0 when absent)."""
    _expect_type(obj, MessageType.HEARTBEAT)
    ts = obj.get("ts_us", 0)
    if type(ts) is not int or not _TS_MIN <= ts <= _TS_MAX:
        raise _bad("ts_us", "must be a signed 64-bit integer", RejectReason.BAD_MESSAGE)
    return Heartbeat(ts_us=ts)


def parse_cancel(obj: Mapping[str, Any]) -> Cancel:
    """Validate a ``cancel`` (SDK side)."""
    _expect_type(obj, MessageType.CANCEL)
    code = RejectReason.BAD_MESSAGE
    instruction_id = _text(obj, "instruction_id", code)
    if not instruction_id:
        raise _bad("instruction_id", "must not be empty", code)
    return Cancel(instruction_id=instruction_id, reason=_text(obj, "reason", code, default=""))


def parse_status(obj: Mapping[str, Any]) -> Status:
    """Validate a ``status`` (daemon side); OFFLINE means the executor is going away."""
    _expect_type(obj, MessageType.STATUS)
    code = RejectReason.BAD_MESSAGE
    try:
        status = ExecutorStatus(obj.get("status"))
    except ValueError:
        raise _bad("status", f"is not a known status: {obj.get('status')!r}", code) from None
    return Status(status=status, detail=_text(obj, "detail", code, default=""))


def parse_instruction(obj: Mapping[str, Any]) -> ExecutorInstructionEnvelope:
    """Validate an ``instruction`` (SDK side) into an envelope, re-checking every Phase-20 rule."""
    _expect_type(obj, MessageType.INSTRUCTION)
    try:
        return instruction_from_wire(obj.get("instruction"))
    except InstructionError as exc:
        raise _bad(f"instruction.{exc.field}", exc.reason, RejectReason.BAD_MESSAGE) from None


# --- one-step decoding of frame bodies (msgspec) --------------------------------------------


class MessageError(ProtocolError):
    """A frame after the hello that is not a valid message; ``message_type`` is the frame's raw
    ``"type"`` value (None when absent) so the hub can treat a bad ``status`` (ignored, logged),
    a bad ``heartbeat`` (ignored) and an unknown type (a protocol breach) differently."""

    def __init__(self, reason_code: str, reason: str, *, message_type: object) -> None:
        super().__init__(reason_code, reason)
        self.message_type = message_type


class ResponseMessage(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.RESPONSE):
    """Executor → daemon: a ``response``; ``response`` is the raw object, judged by the
    Phase-20 rules (``validate_executor_response``), not here; ``evidence`` the raw
    ``evidence`` field (base64 of the evidence bytes, or absent), judged with it."""

    response: object = None
    evidence: object = None


ExecutorMessage: TypeAlias = ResponseMessage | Heartbeat | Status

_Text = Annotated[str, Meta(max_length=_MAX_TEXT)]


class _DuplicateCommand(ValueError):
    pass


class _HelloWire(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.HELLO):
    executor_id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")]
    protocol_version: int
    commands: Annotated[tuple[ExecutorCommandType, ...], Meta(min_length=1)]
    slots: Annotated[int, Meta(ge=1, le=MAX_SLOTS)] = 1
    software: _Text = ""

    def __post_init__(self) -> None:
        if len(set(self.commands)) != len(self.commands):
            raise _DuplicateCommand("commands: a command type is listed twice")


class _NoMessage(msgspec.Struct, frozen=True, tag_field="type", tag="\x00"):
    """Never sent: decoding a union (not one Struct) makes msgspec require the ``type`` tag."""


_HELLO_DECODER: Final = msgspec.json.Decoder(_HelloWire | _NoMessage)
_MESSAGE_DECODER: Final[msgspec.json.Decoder[ExecutorMessage]] = msgspec.json.Decoder(
    ExecutorMessage
)


def decode_hello(body: bytes | bytearray | memoryview) -> Hello:
    """Decode a first frame's body into a ``Hello`` in one step.

    Raises ``FrameDecodeError`` when the body is not a JSON object, ``ProtocolError`` (BAD_HELLO,
    UNSUPPORTED_VERSION, exactly as ``parse_hello``) when it is not a valid hello.
    """
    try:
        wire = _HELLO_DECODER.decode(body)
    except Exception:  # any failure (ValidationError, not UTF-8, too deep): the slow path
        # The slow path: FrameDecodeError for a body that is no JSON object, else the
        # hand-written rules raise the stable ProtocolError.
        return parse_hello(decode_body(body))
    if isinstance(wire, _NoMessage) or wire.protocol_version not in SUPPORTED_VERSIONS:
        return parse_hello(decode_body(body))
    return Hello(
        executor_id=wire.executor_id,
        protocol_version=wire.protocol_version,
        commands=wire.commands,
        slots=wire.slots,
        software=wire.software,
    )


def decode_executor_message(body: bytes | bytearray | memoryview) -> ExecutorMessage:
    """Decode a frame body an executor sent after its hello: a ``response``, ``heartbeat`` or
    ``status``, in one step.

    Raises ``FrameDecodeError`` when the body is not a JSON object and ``MessageError``
    (BAD_MESSAGE) for an unknown type or an invalid heartbeat/status.
    """
    try:
        return _MESSAGE_DECODER.decode(body)
    except Exception:  # any failure (ValidationError, not UTF-8, too deep): the slow path
        return _explain_message(decode_body(body))


def _explain_message(frame: Mapping[str, Any]) -> ExecutorMessage:
    """The slow path of ``decode_executor_message``: the hand-written rules decide."""
    kind = frame.get("type")
    try:
        if kind == MessageType.RESPONSE:
            return ResponseMessage(frame.get("response"), frame.get("evidence"))
        if kind == MessageType.HEARTBEAT:
            return parse_heartbeat(frame)
        if kind == MessageType.STATUS:
            return parse_status(frame)
    except ProtocolError as exc:
        raise MessageError(exc.reason_code, exc.reason, message_type=kind) from None
    raise MessageError(
        RejectReason.BAD_MESSAGE,
        f"unexpected message type {str(kind)[:64]!r}",
        message_type=kind,
    )
