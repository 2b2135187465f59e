"""Tests of supervisor.wire.executor: message dataclasses, wire dicts and validation."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.safety import build_executor_instruction, instruction_to_wire
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Cancel,
    Heartbeat,
    Hello,
    ProtocolError,
    Reject,
    RejectReason,
    Status,
    Welcome,
    instruction_message,
    parse_cancel,
    parse_heartbeat,
    parse_hello,
    parse_instruction,
    parse_reject,
    parse_status,
    parse_welcome,
    response_message,
)


def _hello(**changes: object) -> dict[str, Any]:
    wire: dict[str, Any] = Hello(
        executor_id="web-1",
        protocol_version=PROTOCOL_VERSION,
        commands=(ExecutorCommandType.READ, ExecutorCommandType.NAVIGATE),
        slots=2,
        software="test/1",
    ).to_wire()
    wire.update(changes)
    return wire


def test_hello_round_trips() -> None:
    """A hello's wire dict parses back into an equal Hello."""
    hello = parse_hello(_hello())
    assert hello.executor_id == "web-1"
    assert hello.commands == (ExecutorCommandType.READ, ExecutorCommandType.NAVIGATE)
    assert hello.slots == 2
    assert hello.to_wire() == _hello()


def test_hello_defaults_slots_and_software() -> None:
    """slots defaults to 1 and software to '' when absent."""
    wire = _hello()
    del wire["slots"], wire["software"]
    hello = parse_hello(wire)
    assert (hello.slots, hello.software) == (1, "")


def test_hello_with_unknown_version_names_supported_ones() -> None:
    """An unsupported protocol version is UNSUPPORTED_VERSION and names the supported ones."""
    with pytest.raises(
        ProtocolError, match=r"^UNSUPPORTED_VERSION: protocol version 99 is not"
    ) as info:
        parse_hello(_hello(protocol_version=99))
    assert info.value.reason_code == RejectReason.UNSUPPORTED_VERSION
    assert "supported: 1" in info.value.reason


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"type": "status"}, r"^BAD_HELLO: the first message must be 'hello'"),
        ({"protocol_version": "1"}, r"^BAD_HELLO: field 'protocol_version' must be an integer$"),
        ({"executor_id": ""}, r"^BAD_HELLO: field 'executor_id' must be 1-128"),
        ({"executor_id": "a b"}, r"^BAD_HELLO: field 'executor_id'"),
        ({"executor_id": "x" * 129}, r"^BAD_HELLO: field 'executor_id'"),
        ({"commands": []}, r"^BAD_HELLO: field 'commands' must be a non-empty list"),
        (
            {"commands": ["FLY"]},
            r"^BAD_HELLO: field 'commands' names an unknown command type 'FLY'$",
        ),
        ({"commands": ["READ", "READ"]}, r"^BAD_HELLO: field 'commands' lists READ twice$"),
        ({"slots": 0}, r"^BAD_HELLO: field 'slots' must be between 1 and 1024, got 0$"),
        ({"slots": True}, r"^BAD_HELLO: field 'slots' must be an integer, got bool$"),
        ({"software": 5}, r"^BAD_HELLO: field 'software' must be a string, got int$"),
    ],
)
def test_bad_hellos_are_rejected_with_the_field(changes: dict[str, object], pattern: str) -> None:
    """Every malformed hello is BAD_HELLO naming the field."""
    with pytest.raises(ProtocolError, match=pattern):
        parse_hello(_hello(**changes))


def test_welcome_round_trips() -> None:
    """A welcome's wire dict parses back into an equal Welcome."""
    welcome = Welcome(
        executor_id="web-1",
        protocol_version=1,
        heartbeat_interval_ms=5000,
        heartbeat_misses=3,
        max_frame_bytes=1_048_576,
    )
    assert parse_welcome(welcome.to_wire()) == welcome


def test_welcome_with_missing_limit_is_refused() -> None:
    """A welcome without heartbeat_interval_ms is a BAD_MESSAGE."""
    wire = {"type": "welcome", "executor_id": "x", "protocol_version": 1}
    with pytest.raises(ProtocolError, match=r"^BAD_MESSAGE: field 'heartbeat_interval_ms'"):
        parse_welcome(wire)


def test_reject_round_trips() -> None:
    """A reject's wire dict parses back, retry hint and supported versions included."""
    reject = Reject(RejectReason.QUARANTINED, "quarantined", 1500)
    parsed = parse_reject(reject.to_wire())
    assert parsed == reject
    assert parsed.supported_versions == (PROTOCOL_VERSION,)


def test_reject_with_negative_retry_is_refused() -> None:
    """retry_after_ms must be null or a non-negative integer."""
    wire = Reject("X", "y").to_wire() | {"retry_after_ms": -1}
    with pytest.raises(ProtocolError, match=r"^BAD_MESSAGE: field 'retry_after_ms'"):
        parse_reject(wire)


def test_heartbeat_cancel_status_round_trip() -> None:
    """heartbeat, cancel and status messages round-trip through their parsers."""
    assert parse_heartbeat(Heartbeat(ts_us=42).to_wire()) == Heartbeat(ts_us=42)
    assert parse_heartbeat({"type": "heartbeat"}) == Heartbeat(ts_us=0)
    assert parse_cancel(Cancel("i-1").to_wire()) == Cancel("i-1", "deadline")
    status = Status(ExecutorStatus.BUSY, "draining")
    assert parse_status(status.to_wire()) == status


def test_cancel_needs_an_instruction_id() -> None:
    """A cancel without an instruction id is refused."""
    with pytest.raises(ProtocolError, match=r"^BAD_MESSAGE: field 'instruction_id' must not be"):
        parse_cancel({"type": "cancel", "instruction_id": ""})


def test_status_must_be_a_known_value() -> None:
    """A status outside READY/BUSY/OFFLINE/ERROR is refused."""
    with pytest.raises(ProtocolError, match=r"^BAD_MESSAGE: field 'status' is not a known status"):
        parse_status({"type": "status", "status": "SLEEPY"})


def test_parsers_check_the_message_type() -> None:
    """Each parser refuses a message of another type."""
    with pytest.raises(
        ProtocolError, match=r"^BAD_MESSAGE: expected a 'cancel' message, got type 'status'$"
    ):
        parse_cancel({"type": "status"})


def test_instruction_message_round_trips_through_phase20_rules() -> None:
    """An instruction message carries the envelope's wire dict and parses back equal."""
    envelope = build_executor_instruction(
        instruction_id="i-1",
        execution_id="e-1",
        command_type="READ",
        target_selector="#title",
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=1000,
        parameters={"attribute": "href"},
    )
    message = instruction_message(instruction_to_wire(envelope))
    assert message["type"] == "instruction"
    assert parse_instruction(message) == envelope


def test_invalid_instruction_names_the_field() -> None:
    """An instruction that breaks a Phase-20 rule is refused naming the field."""
    message = {"type": "instruction", "instruction": {"instruction_id": "i-1"}}
    with pytest.raises(ProtocolError, match=r"^BAD_MESSAGE: field 'instruction\.execution_id'"):
        parse_instruction(message)


def test_response_message_wraps_the_response_object() -> None:
    """response_message nests the response object under 'response'."""
    assert response_message({"instruction_id": "i"}) == {
        "type": "response",
        "response": {"instruction_id": "i"},
    }


# --- one-step decoders -----------------------------------------------------------------------


def test_decode_hello_matches_parse_hello() -> None:
    """decode_hello returns the same Hello as parse_hello, and the same ProtocolError."""
    import orjson

    from supervisor.wire.executor import decode_hello

    assert decode_hello(orjson.dumps(_hello())) == parse_hello(_hello())
    for changes in ({"protocol_version": 99}, {"executor_id": "a b"}, {"commands": ["READ"] * 2}):
        with pytest.raises(ProtocolError) as decoded:
            decode_hello(orjson.dumps(_hello(**changes)))
        with pytest.raises(ProtocolError) as parsed:
            parse_hello(_hello(**changes))
        assert (decoded.value.reason_code, decoded.value.reason) == (
            parsed.value.reason_code,
            parsed.value.reason,
        )
    wire = _hello()
    del wire["type"]
    with pytest.raises(ProtocolError, match="the first message must be 'hello'"):
        decode_hello(orjson.dumps(wire))


def test_decode_executor_message_types_and_errors() -> None:
    """response/heartbeat/status decode to their messages; anything else is a MessageError
    that carries the raw type; a non-object body is a FrameDecodeError."""
    from supervisor.wire.executor import MessageError, ResponseMessage, decode_executor_message
    from supervisor.wire.frames import FrameDecodeError

    assert decode_executor_message(b'{"type":"response","response":{"a":1}}') == ResponseMessage(
        {"a": 1}
    )
    assert decode_executor_message(b'{"type":"heartbeat"}') == Heartbeat(ts_us=0)
    assert decode_executor_message(b'{"type":"status","status":"BUSY"}') == Status(
        ExecutorStatus.BUSY
    )
    for body, kind in [
        (b'{"type":"status","status":"NOPE"}', "status"),
        (b'{"type":"heartbeat","ts_us":"x"}', "heartbeat"),
        (b'{"type":"hello"}', "hello"),
        (b'{"type":{}}', {}),
        (b"{}", None),
    ]:
        with pytest.raises(MessageError) as info:
            decode_executor_message(body)
        assert info.value.message_type == kind
        assert info.value.reason_code == RejectReason.BAD_MESSAGE
    with pytest.raises(FrameDecodeError):
        decode_executor_message(b"[]")
    assert Heartbeat(ts_us=5).to_wire() == {"type": "heartbeat", "ts_us": 5}
    assert Status(ExecutorStatus.READY).to_wire() == {
        "type": "status",
        "status": "READY",
        "detail": "",
    }


@pytest.mark.parametrize("kind", ["hello", "response", "heartbeat"])
def test_json_nested_too_deep_is_a_frame_error(kind: str) -> None:
    """A frame nested 100,000 deep (msgspec raises RecursionError) is a FrameDecodeError."""
    from supervisor.wire.executor import decode_executor_message, decode_hello
    from supervisor.wire.frames import FrameDecodeError

    body = b'{"type":"' + kind.encode() + b'","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    decode = decode_hello if kind == "hello" else decode_executor_message
    with pytest.raises(FrameDecodeError, match="depth limit exceeded"):
        decode(body)
