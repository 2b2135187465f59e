"""The SDK's side of the executor protocol's messages: frames from the daemon decoded in one
typed step, and answers encoded as frames.

``decode_frame`` turns one frame body into an ``InstructionFrame``, a ``Cancel``, a ``Heartbeat``
or, for anything else (``reject``, future types, and every body the typed decoder does not take),
the frame's plain object for the hand-written rules of ``supervisor.wire.executor``. The typed
decoder is msgspec Structs whose constraints are the Phase-20 instruction rules
(``sandbox.policy.safety.build_executor_instruction``); it may refuse what the rules accept (then
the rules decide, and say why), never the other way round. Two rules it leaves to the policy
itself: a NAVIGATE's URL and the authority check of parameter keys. A NAVIGATE always goes the
policy's way; a parameter key is taken on the fast path only once the policy has accepted it in
an earlier instruction (``_KNOWN_KEYS``, bounded), so no rule is written twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

import msgspec
import structlog
from msgspec import Meta

from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from sandbox.policy.safety import (
    MAX_ID_CHARS,
    MAX_PARAMETER_INT,
    MAX_PARAMETER_KEY_CHARS,
    MAX_PARAMETER_VALUE_CHARS,
    MAX_PARAMETERS,
    MAX_SELECTOR_CHARS,
    MAX_TIMEOUT_MS,
    MAX_TIMESTAMP_CHARS,
    MAX_URL_CHARS,
)
from supervisor.sdk.executor import Result
from supervisor.wire.executor import (
    Cancel,
    Heartbeat,
    MessageType,
    parse_instruction,
    response_message,
)
from supervisor.wire.frames import HEADER_SIZE, decode_body, encode_frame

__all__ = ["InstructionFrame", "answer_frame", "decode_frame", "instruction_of"]

_log = structlog.get_logger("supervisor.sdk")

_PLAIN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*\Z"  # no control characters (the policy's rule)
_Id = Annotated[
    str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z", max_length=MAX_ID_CHARS)
]  # fmt: skip
_Stamp = Annotated[str, Meta(min_length=1, max_length=MAX_TIMESTAMP_CHARS, pattern=_PLAIN)]
_Url = Annotated[str, Meta(max_length=MAX_URL_CHARS, pattern=_PLAIN)]
_Selector = Annotated[str, Meta(max_length=MAX_SELECTOR_CHARS, pattern=_PLAIN)]
_Key = Annotated[
    str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*\Z", max_length=MAX_PARAMETER_KEY_CHARS)
]  # fmt: skip
_Value = (
    bool
    | Annotated[int, Meta(ge=-MAX_PARAMETER_INT, le=MAX_PARAMETER_INT)]
    | Annotated[str, Meta(max_length=MAX_PARAMETER_VALUE_CHARS, pattern=_PLAIN)]
)
_Text = Annotated[str, Meta(max_length=4096)]
#: Commands that need a selector / may have one (the policy's table; the rest take none).
_SELECTOR_REQUIRED: Final = frozenset(
    {ExecutorCommandType.CLICK, ExecutorCommandType.READ, ExecutorCommandType.EXTRACT}
)
_SELECTOR_OPTIONAL: Final = frozenset({ExecutorCommandType.SCROLL, ExecutorCommandType.SCREENSHOT})
_NAVIGATE: Final = ExecutorCommandType.NAVIGATE
#: Parameter keys the policy accepted in an earlier instruction of this process.
_KNOWN_KEYS: set[str] = set()
_MAX_KNOWN_KEYS: Final = 4096


class _Envelope(msgspec.Struct, frozen=True):
    instruction_id: _Id
    execution_id: _Id
    command_type: ExecutorCommandType
    timestamp: _Stamp
    timeout_ms: Annotated[int, Meta(ge=1, le=MAX_TIMEOUT_MS)]
    target_url: _Url = ""
    target_selector: _Selector = ""
    parameters: Annotated[dict[_Key, _Value], Meta(max_length=MAX_PARAMETERS)] = {}


class _InstructionWire(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.INSTRUCTION):
    instruction: _Envelope
    traceparent: str | None = None


class _CancelWire(msgspec.Struct, frozen=True, tag_field="type", tag=MessageType.CANCEL):
    instruction_id: Annotated[_Text, Meta(min_length=1)]
    reason: _Text = ""


_DECODER: Final[msgspec.json.Decoder[_InstructionWire | _CancelWire | Heartbeat]] = (
    msgspec.json.Decoder(_InstructionWire | _CancelWire | Heartbeat)
)


class InstructionFrame:
    """An ``instruction`` from the daemon: the envelope (``None`` when it broke a Phase-20 rule:
    then ``error`` says which and ``instruction_id`` is the raw id, "" when there is none) and
    the attempt's ``traceparent``."""

    __slots__ = ("envelope", "error", "instruction_id", "traceparent")

    def __init__(
        self,
        envelope: ExecutorInstructionEnvelope | None,
        traceparent: str | None,
        *,
        instruction_id: str = "",
        error: Exception | None = None,
    ) -> None:
        self.envelope = envelope
        self.traceparent = traceparent
        self.instruction_id = envelope.instruction_id if envelope is not None else instruction_id
        self.error = error


def decode_frame(
    body: bytes | bytearray | memoryview,
) -> InstructionFrame | Cancel | Heartbeat | dict[str, Any]:
    """One frame body from the daemon, decoded (see the module docs). Raises
    ``FrameDecodeError`` when the body is no JSON object, as ``decode_body`` does; a bad
    ``cancel`` comes back as its plain object (``parse_cancel`` raises on it)."""
    try:
        message = _DECODER.decode(body)
    except Exception:  # any failure (ValidationError, not UTF-8, too deep): the slow path
        frame = decode_body(body)
        if frame.get("type") == MessageType.INSTRUCTION:
            return instruction_of(frame)
        return frame
    if isinstance(message, _InstructionWire):
        envelope = _fast_envelope(message.instruction)
        if envelope is None:  # the policy decides (and explains)
            return instruction_of(decode_body(body))
        return InstructionFrame(envelope, message.traceparent)
    if isinstance(message, _CancelWire):
        return Cancel(message.instruction_id, message.reason)
    return message


def instruction_of(frame: Mapping[str, Any]) -> InstructionFrame:
    """An ``instruction`` frame's plain object through the Phase-20 rules
    (``parse_instruction``)."""
    traceparent = frame.get("traceparent")
    trace = traceparent if isinstance(traceparent, str) else None
    try:
        envelope = parse_instruction(frame)
    except Exception as exc:  # ProtocolError: the rule it broke
        body = frame.get("instruction")
        iid = body.get("instruction_id") if isinstance(body, dict) else None
        return InstructionFrame(
            None, trace, instruction_id=iid if isinstance(iid, str) else "", error=exc
        )
    if len(_KNOWN_KEYS) < _MAX_KNOWN_KEYS:
        _KNOWN_KEYS.update(envelope.parameters)
    return InstructionFrame(envelope, trace)


def _fast_envelope(wire: _Envelope) -> ExecutorInstructionEnvelope | None:
    """The envelope when the typed fields pass the rules left after decoding, else None."""
    command = wire.command_type
    selector = wire.target_selector
    if command is _NAVIGATE or wire.target_url:
        return None
    if command in _SELECTOR_REQUIRED:
        if not selector.strip():
            return None
    elif selector and command not in _SELECTOR_OPTIONAL:
        return None
    parameters = wire.parameters
    if parameters and not _KNOWN_KEYS.issuperset(parameters):
        return None
    return ExecutorInstructionEnvelope(
        instruction_id=wire.instruction_id,
        execution_id=wire.execution_id,
        command_type=command,
        target_url="",
        target_selector=selector,
        timestamp=wire.timestamp,
        timeout_ms=wire.timeout_ms,
        parameters=parameters,
    )


def answer_frame(iid: str, result: Result | Mapping[str, Any], *, limit: int | None) -> bytes:
    """The ``response`` frame answering *iid* with *result* (a plain mapping is sent verbatim).
    Over the daemon's frame *limit*: without the attached evidence (its hash stays), and when
    even that is too large, a FAILURE saying so (the daemon would drop the connection)."""
    if isinstance(result, Result):
        body = result.to_wire(iid)
        evidence = result.evidence
    else:
        body, evidence = dict(result), None
    frame = encode_frame(response_message(body, evidence=evidence))
    if limit is None or len(frame) - HEADER_SIZE <= limit:
        return frame
    if evidence is not None:
        # The daemon's frames are smaller than the evidence: send its hash alone.
        _log.warning(
            "response_too_large", instruction_id=iid, size=len(frame), limit=limit,
            evidence_dropped=True,
        )  # fmt: skip
        frame = encode_frame(response_message(body))
        if len(frame) - HEADER_SIZE <= limit:
            return frame
    _log.warning("response_too_large", instruction_id=iid, size=len(frame), limit=limit)
    message = f"the response of {len(frame)} bytes exceeds max_frame_bytes={limit}"
    return encode_frame(response_message(Result.failure(message).to_wire(iid)))
