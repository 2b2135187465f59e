"""Phase-20 build_executor_instruction: request data validated into a frozen envelope."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from sandbox.policy.safety import (
    MAX_TIMEOUT_MS,
    InstructionError,
    build_executor_instruction,
    instruction_from_wire,
    instruction_to_wire,
)

C = ExecutorCommandType


def _build(**changes: object) -> ExecutorInstructionEnvelope:
    fields: dict[str, object] = {
        "instruction_id": "INS-1",
        "execution_id": "EXE-1",
        "command_type": "NAVIGATE",
        "target_url": "https://example.com/path?q=1#frag",
        "target_selector": "",
        "timestamp": "2026-01-25T15:30:00Z",
        "timeout_ms": 5000,
    }
    fields.update(changes)
    return build_executor_instruction(**fields)


def _rejects(field: str, **changes: object) -> InstructionError:
    with pytest.raises(InstructionError, match=rf"^{field}: ") as info:
        _build(**changes)
    assert info.value.field == field
    assert info.value.reason_code == rc.INSTRUCTION_REJECTED
    assert isinstance(info.value, ValueError)
    return info.value


def test_navigate_builds_a_frozen_envelope() -> None:
    """A valid NAVIGATE request becomes a frozen envelope with the enum member."""
    envelope = _build()
    assert envelope.command_type is C.NAVIGATE
    assert envelope.timeout_ms == 5000
    with pytest.raises(dataclasses.FrozenInstanceError):
        envelope.target_url = "https://evil.example"  # type: ignore[misc]


def test_command_type_member_is_accepted() -> None:
    """The command type may be given as the enum member itself."""
    assert _build(command_type=C.NAVIGATE).command_type is C.NAVIGATE


@pytest.mark.parametrize("command", ["navigate", "OPEN", "", None, 3, "NAVIGATE "])
def test_unknown_command_type_is_rejected(command: object) -> None:
    """Only the seven member names (exact case) are command types."""
    _rejects("command_type", command_type=command)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("instruction_id", ""),
        ("instruction_id", None),
        ("instruction_id", "a" * 129),
        ("instruction_id", "bad id"),
        ("instruction_id", "-leading"),
        ("instruction_id", "x/../y"),
        ("execution_id", ""),
        ("execution_id", 12),
        ("execution_id", "new\nline"),
    ],
)
def test_ids_are_bounded_and_safe(field: str, value: object) -> None:
    """Ids are non-empty, at most 128 characters of [A-Za-z0-9._:-], starting alphanumeric."""
    _rejects(field, **{field: value})


def test_longest_id_is_accepted() -> None:
    """An id of exactly 128 characters is accepted."""
    assert _build(instruction_id="a" * 128).instruction_id == "a" * 128


@pytest.mark.parametrize("timeout", [0, -1, MAX_TIMEOUT_MS + 1, True, 1.5, "100", None])
def test_timeout_must_be_positive_and_bounded(timeout: object) -> None:
    """timeout_ms is an int in 1..600000 (ten minutes); bool and float are rejected."""
    _rejects("timeout_ms", timeout_ms=timeout)


@pytest.mark.parametrize("timeout", [1, MAX_TIMEOUT_MS])
def test_timeout_bounds_are_inclusive(timeout: int) -> None:
    """1 ms and exactly ten minutes are accepted."""
    assert _build(timeout_ms=timeout).timeout_ms == timeout


@pytest.mark.parametrize("timestamp", ["", None, 5, "t" * 65, "2026\x00"])
def test_timestamp_is_a_short_clean_string(timestamp: object) -> None:
    """The timestamp is a non-empty string of at most 64 characters without control characters."""
    _rejects("timestamp", timestamp=timestamp)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "example.com",
        "/relative/path",
        "ftp://example.com/",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "data:text/html,hi",
        "https://",
        "https:///path",
        "https://user:pw@example.com/",
        "https://user@example.com/",
        "https://exa mple.com/",
        "https://example.com/\x00",
        "https://example.com/a b",
        "https://example.com/\t",
        "https://example.com:99999/",
        "https://example.com:0/",
        "https://-bad-.com/",
        "https://exa_mple.com/",
        "https://" + "a" * 2048 + ".com/",
        7,
    ],
)
def test_navigate_url_rules(url: object) -> None:
    """NAVIGATE needs an absolute http(s) URL with a valid host, no credentials, no spaces."""
    _rejects("target_url", target_url=url)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com",
        "https://example.com/",
        "HTTPS://Example.COM/path?q=a&b=c#x",
        "https://localhost:8080/x",
        "http://127.0.0.1/",
        "http://[::1]:3000/",
        "https://a.b.c.example.org./deep/path",
    ],
)
def test_navigate_accepts_good_urls(url: str) -> None:
    """Valid absolute http/https URLs are accepted unchanged."""
    assert _build(target_url=url).target_url == url


def test_navigate_takes_no_selector() -> None:
    """A selector on NAVIGATE is rejected."""
    _rejects("target_selector", target_selector="#main")


@pytest.mark.parametrize("command", ["CLICK", "READ", "EXTRACT"])
def test_selector_commands_require_a_selector(command: str) -> None:
    """CLICK, READ and EXTRACT require a non-empty selector and take no URL."""
    ok = _build(command_type=command, target_url="", target_selector="#main > a")
    assert ok.target_selector == "#main > a"
    _rejects("target_selector", command_type=command, target_url="", target_selector="")
    _rejects("target_selector", command_type=command, target_url="", target_selector="   ")
    _rejects("target_selector", command_type=command, target_url="", target_selector="a\x07")
    _rejects("target_selector", command_type=command, target_url="", target_selector="a" * 1025)
    _rejects("target_selector", command_type=command, target_url="", target_selector=None)
    _rejects("target_url", command_type=command, target_selector="#x")


@pytest.mark.parametrize("command", ["SCROLL", "SCREENSHOT"])
def test_optional_selector_commands(command: str) -> None:
    """SCROLL and SCREENSHOT take an optional selector and no URL."""
    assert _build(command_type=command, target_url="").target_selector == ""
    assert _build(command_type=command, target_url="", target_selector="#x").target_selector == "#x"
    _rejects("target_url", command_type=command)


def test_shutdown_takes_nothing() -> None:
    """SHUTDOWN takes neither URL nor selector."""
    assert _build(command_type="SHUTDOWN", target_url="").command_type is C.SHUTDOWN
    _rejects("target_url", command_type="SHUTDOWN")
    _rejects("target_selector", command_type="SHUTDOWN", target_url="", target_selector="#x")


def test_parameters_are_frozen_and_typed() -> None:
    """Parameters map safe keys to str, int or bool and are frozen in the envelope."""
    envelope = _build(
        command_type="SCROLL", target_url="", parameters={"dx": 0, "dy": 400, "smooth": True}
    )
    assert dict(envelope.parameters) == {"dx": 0, "dy": 400, "smooth": True}
    with pytest.raises(TypeError):
        envelope.parameters["dy"] = 1  # type: ignore[index]
    assert _build().parameters == {}


@pytest.mark.parametrize(
    "parameters",
    [
        ["dx", 1],
        {"": 1},
        {1: 1},
        {"bad key": 1},
        {"k" * 65: 1},
        {"x": 1.5},
        {"x": None},
        {"x": [1]},
        {"x": {"y": 1}},
        {"x": 2**60},
        {"x": "v" * 4097},
        {"x": "a\x00b"},
        {"max_retries": 9},
        {"Decision": "RETRY"},
        {f"k{i}": i for i in range(33)},
    ],
)
def test_bad_parameters_are_rejected(parameters: object) -> None:
    """Parameters: bounded count, safe keys, no authority keys, str/int/bool values only."""
    _rejects("parameters", parameters=parameters)


def test_wire_round_trip() -> None:
    """instruction_to_wire gives plain JSON types; instruction_from_wire re-validates it."""
    envelope = _build(parameters={"wait": True})
    wire = instruction_to_wire(envelope)
    assert wire == {
        "instruction_id": "INS-1",
        "execution_id": "EXE-1",
        "command_type": "NAVIGATE",
        "target_url": "https://example.com/path?q=1#frag",
        "target_selector": "",
        "timestamp": "2026-01-25T15:30:00Z",
        "timeout_ms": 5000,
        "parameters": {"wait": True},
    }
    assert instruction_from_wire(wire) == envelope


def test_wire_decoding_rejects_junk() -> None:
    """instruction_from_wire rejects a non-object and re-applies the rules."""
    with pytest.raises(InstructionError, match=r"^instruction: must be a JSON object$"):
        instruction_from_wire(["NAVIGATE"])
    with pytest.raises(InstructionError, match=r"^timeout_ms: "):
        instruction_from_wire({**instruction_to_wire(_build()), "timeout_ms": 0})


def test_direct_envelope_defaults_to_no_parameters() -> None:
    """An envelope built directly (trusted path) has empty, read-only parameters by default."""
    envelope = ExecutorInstructionEnvelope("I", "E", C.SHUTDOWN, "", "", "t", 10)
    assert envelope.parameters == {}
    with pytest.raises(TypeError):
        envelope.parameters["x"] = 1  # type: ignore[index]
