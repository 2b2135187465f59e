"""Tests of supervisor.turns.requests: a submitted turn (decoded by the control wire, as the
daemon takes it) checked into its typed spec, the spec as the store keeps it decoded back after
a restart, and every refusal naming its field."""

from __future__ import annotations

import json
import re

import pytest

from sandbox.policy import reason_codes
from sandbox.policy.attempts import AgentPhase
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnKind
from supervisor.errors import RequestError
from supervisor.turns.requests import InstructionSpec, ProcessSpec, TurnRequest
from supervisor.wire.turn_spec import decode_spec, encode_spec, spec_to_dict
from tests.turn_requests import submitted as parse_turn_request

TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
#: a value in a test's extra params that removes the key from the request
ABSENT = object()


def _params(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    merged = {**base, **extra}
    return {key: value for key, value in merged.items() if value is not ABSENT}


def _instruction(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "session_id": "SES-1",
        "kind": "instruction",
        "declared_outputs": [],
        "command_type": "READ",
        "target_selector": "h1",
    }
    return _params(base, extra)


def _process(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "session_id": "SES-1",
        "kind": "process",
        "declared_outputs": [],
        "argv": ["/bin/true"],
    }
    return _params(base, extra)


def test_an_instruction_turn_parses_to_typed_values() -> None:
    """An instruction turn gets its command as an enum, the default timeout, and its parameters."""
    request = parse_turn_request(
        _instruction(
            command_type="EXTRACT",
            target_selector="table.results",
            parameters={"attr": "text", "limit": 5, "all": True},
            declared_inputs=["notes.md"],
            phase="GREEN",
            idempotency_key="extract-1",
            traceparent=TRACEPARENT,
        ),
        default_timeout_ms=12_345,
    )
    assert request == TurnRequest(
        session_id="SES-1",
        spec=InstructionSpec(
            timeout_ms=12_345,
            declared_outputs=(),
            declared_inputs=("notes.md",),
            phase=AgentPhase.GREEN,
            traceparent=TRACEPARENT,
            command_type=ExecutorCommandType.EXTRACT,
            target_url="",
            target_selector="table.results",
            parameters={"attr": "text", "limit": 5, "all": True},
        ),
        idempotency_key="extract-1",
    )
    assert request.kind is TurnKind.INSTRUCTION
    assert request.instruction is request.spec
    assert request.process is None


def test_a_process_turn_parses_to_typed_values() -> None:
    """A process turn gets its argv as a tuple, its declarations typed, and a 30 s timeout."""
    request = parse_turn_request(
        _process(
            argv=["/usr/bin/make", "-C", "src", "test"],
            declared_outputs=["report.txt", {"path": "logs/run.log", "role": "log"}],
            declared_inputs=["src/Makefile"],
            phase="RED",
        )
    )
    assert request == TurnRequest(
        session_id="SES-1",
        spec=ProcessSpec(
            timeout_ms=30_000,
            declared_outputs=(
                DeclaredOutput("report.txt", "output"),
                DeclaredOutput("logs/run.log", "log"),
            ),
            declared_inputs=("src/Makefile",),
            phase=AgentPhase.RED,
            argv=("/usr/bin/make", "-C", "src", "test"),
        ),
    )
    assert request.kind is TurnKind.PROCESS
    assert request.process is request.spec
    assert request.instruction is None
    assert (request.idempotency_key, request.spec.traceparent) == (None, None)


def test_an_explicit_timeout_wins_over_the_default() -> None:
    """A turn's own timeout_ms is kept; default_timeout_ms only fills it in when absent."""
    request = parse_turn_request(_process(timeout_ms=250), default_timeout_ms=9_000)
    assert request.spec == ProcessSpec(argv=("/bin/true",), timeout_ms=250)


@pytest.mark.parametrize(
    "params",
    [
        _instruction(
            command_type="NAVIGATE",
            target_selector=ABSENT,
            target_url="https://example.test/a?b=1",
            parameters={"wait": True, "retries_hint": 2, "lang": "en"},
            timeout_ms=5_000,
            declared_inputs=["in/a.txt", "in/b.txt"],
            phase="VERIFY",
            traceparent=TRACEPARENT,
        ),
        _instruction(command_type="SCROLL", target_selector=""),
        _process(
            argv=["/bin/sh", "-c", "echo hi > out.txt"],
            declared_outputs=[
                "out.txt",
                {"path": "logs/run.log", "role": "log"},
                {"path": "tmp/**", "role": "scratch"},
            ],
            declared_inputs=["in/a.txt"],
            phase="REFACTOR",
            timeout_ms=600_000,
            traceparent=TRACEPARENT,
        ),
        _process(),
    ],
    ids=["instruction-full", "instruction-bare", "process-full", "process-bare"],
)
def test_a_stored_spec_decodes_to_the_same_spec(params: dict[str, object]) -> None:
    """The spec as the store keeps it decodes, after a restart, to an equal spec of the same
    type (a daemon restarted with another default keeps the accepted timeout)."""
    request = parse_turn_request(params, default_timeout_ms=7_000)
    stored = encode_spec(request.spec)
    again = decode_spec(stored)
    assert again == request.spec
    assert type(again) is type(request.spec)
    assert encode_spec(again) == stored
    assert "session_id" not in json.loads(stored)


def test_a_spec_stored_by_an_earlier_release_still_decodes() -> None:
    """Rows written before the spec was typed (the same JSON object, traceparent absent when
    there was none) decode to the typed spec."""
    old = {
        "kind": "instruction",
        "declared_outputs": [],
        "declared_inputs": ["a.txt"],
        "phase": "GREEN",
        "command_type": "READ",
        "target_url": "",
        "target_selector": "h1",
        "timeout_ms": 1_500,
        "parameters": {"n": 2},
    }
    assert decode_spec(json.dumps(old).encode()) == InstructionSpec(
        timeout_ms=1_500,
        declared_inputs=("a.txt",),
        phase=AgentPhase.GREEN,
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"n": 2},
    )
    process = {"kind": "process", "declared_outputs": [{"path": "o.txt", "role": "log"}],
               "declared_inputs": [], "phase": None, "argv": ["true"], "timeout_ms": 9}  # fmt: skip
    assert decode_spec(json.dumps(process).encode()) == ProcessSpec(
        timeout_ms=9, declared_outputs=(DeclaredOutput("o.txt", "log"),), argv=("true",)
    )


def test_the_spec_carries_no_idempotency_key() -> None:
    """The key is stored beside the spec (NewTurn.idempotency_key), not in it."""
    request = parse_turn_request(_process(idempotency_key="once"))
    assert request.idempotency_key == "once"
    assert "idempotency_key" not in spec_to_dict(request.spec)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (_process(session_id=ABSENT), "session_id"),
        (_process(session_id=""), "session_id"),
        (_process(session_id=7), "session_id"),
        (_process(kind=ABSENT), "kind"),
        (_process(kind="shell"), "kind"),
        (_process(kind="PROCESS"), "kind"),
        (_process(declared_outputs=ABSENT), "declared_outputs"),
        (_process(declared_outputs=None), "declared_outputs"),
        (_process(declared_outputs="out.txt"), "declared_outputs"),
        (_process(declared_outputs=["/etc/passwd"]), "declared_outputs[0].path"),
        (_process(declared_outputs=["ok.txt", "a/../b"]), "declared_outputs[1].path"),
        (_process(declared_outputs=[{"path": "a.txt", "role": ""}]), "declared_outputs[0].role"),
        (_process(declared_outputs=[7]), "declared_outputs[0]"),
        (_process(declared_outputs=["*.txt"]), "declared_outputs[0].path"),
        (_instruction(declared_outputs=["a.txt"]), "declared_outputs"),
        (_process(declared_inputs="in.txt"), "declared_inputs"),
        (_process(declared_inputs=["in.txt", 3]), "declared_inputs[1]"),
        (_process(phase="BLUE"), "phase"),
        (_process(phase="green"), "phase"),
        (_process(idempotency_key=""), "idempotency_key"),
        (_process(idempotency_key="k" * 201), "idempotency_key"),
        (_process(idempotency_key=5), "idempotency_key"),
        (_process(timeout_ms=0), "timeout_ms"),
        (_process(timeout_ms=-1), "timeout_ms"),
        (_process(timeout_ms=600_001), "timeout_ms"),
        (_process(timeout_ms=True), "timeout_ms"),
        (_process(timeout_ms="1000"), "timeout_ms"),
        (_process(timeout_ms=1.5), "timeout_ms"),
        (_instruction(timeout_ms=600_001), "timeout_ms"),
        (_process(traceparent="abc"), "traceparent"),
        (_process(traceparent=TRACEPARENT.upper()), "traceparent"),
        (_process(traceparent="01" + TRACEPARENT[2:]), "traceparent"),
        (_process(traceparent="00-" + "0" * 32 + "-" + "b" * 16 + "-01"), "traceparent"),
        (_process(traceparent=1), "traceparent"),
        (_process(traceparent=TRACEPARENT + "\n"), "traceparent"),
        (_instruction(command_type=ABSENT), "command_type"),
        (_instruction(command_type="FLY"), "command_type"),
        (_instruction(command_type="read"), "command_type"),
        (_instruction(parameters=["a"]), "parameters"),
        (_instruction(parameters="a=1"), "parameters"),
        (_instruction(parameters=[]), "parameters"),
        (_instruction(parameters=0), "parameters"),
        (_instruction(parameters={"nested": ["a"]}), "parameters[...]"),
        (_process(argv=ABSENT), "argv"),
        (_process(argv=[]), "argv"),
        (_process(argv="/bin/true"), "argv"),
        (_process(argv=["/bin/echo", 1]), "argv[1]"),
        (_process(argv=["", "x"]), "argv"),
    ],
    ids=[
        "session-id-missing",
        "session-id-empty",
        "session-id-not-a-string",
        "kind-missing",
        "kind-unknown",
        "kind-upper-case",
        "declared-outputs-missing",
        "declared-outputs-null",
        "declared-outputs-not-a-list",
        "declared-outputs-absolute-path",
        "declared-outputs-dot-dot",
        "declared-outputs-empty-role",
        "declared-outputs-not-a-path",
        "declared-outputs-wildcard-not-scratch",
        "declared-outputs-of-an-instruction",
        "declared-inputs-not-a-list",
        "declared-inputs-not-strings",
        "phase-unknown",
        "phase-lower-case",
        "idempotency-key-0-chars",
        "idempotency-key-201-chars",
        "idempotency-key-not-a-string",
        "timeout-0",
        "timeout-negative",
        "timeout-600001",
        "timeout-bool",
        "timeout-string",
        "timeout-float",
        "timeout-600001-instruction",
        "traceparent-garbage",
        "traceparent-upper-case",
        "traceparent-version-01",
        "traceparent-zero-trace-id",
        "traceparent-not-a-string",
        "traceparent-trailing-newline",
        "command-type-missing",
        "command-type-unknown",
        "command-type-lower-case",
        "parameters-a-list",
        "parameters-a-string",
        "parameters-an-empty-list",
        "parameters-zero",
        "parameters-nested-value",
        "argv-missing",
        "argv-empty",
        "argv-a-string",
        "argv-not-strings",
        "argv-empty-command",
    ],
)
def test_a_bad_request_names_its_field(params: dict[str, object], field: str) -> None:
    """Each refusal is bad_request; its message starts with the field and its details name it."""
    with pytest.raises(RequestError, match=rf"^{re.escape(field)}: ") as info:
        parse_turn_request(params)
    error = info.value
    assert error.code == "bad_request"
    assert error.details == {"field": field}
    assert error.to_wire() == {"code": "bad_request", "message": error.message, "field": field}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (_instruction(command_type="NAVIGATE", target_selector=ABSENT), "target_url"),
        (
            _instruction(command_type="NAVIGATE", target_selector=ABSENT, target_url="ftp://x"),
            "target_url",
        ),
        (
            _instruction(
                command_type="NAVIGATE", target_selector=ABSENT, target_url="https://u:p@x.test/"
            ),
            "target_url",
        ),
        (
            _instruction(command_type="NAVIGATE", target_url="https://x.test/"),
            "target_selector",
        ),
        (_instruction(target_selector=ABSENT), "target_selector"),
        (_instruction(target_selector="   "), "target_selector"),
        (_instruction(target_url="https://x.test/"), "target_url"),
        (_instruction(command_type="SHUTDOWN"), "target_selector"),
        (_instruction(target_selector="a\x00b"), "target_selector"),
        (_instruction(parameters={"policy": "allow"}), "parameters"),
        (_instruction(parameters={"maxRetries": 9}), "parameters"),
        (_instruction(parameters={"1bad": "x"}), "parameters"),
        (_instruction(parameters={"n": 2**53 + 1}), "parameters"),
    ],
    ids=[
        "navigate-without-url",
        "navigate-ftp-url",
        "navigate-url-with-credentials",
        "navigate-with-selector",
        "read-without-selector",
        "read-blank-selector",
        "read-with-url",
        "shutdown-with-selector",
        "selector-control-character",
        "parameter-authority-key",
        "parameter-authority-key-camel-case",
        "parameter-bad-key",
        "parameter-int-out-of-range",
    ],
)
def test_a_phase_20_violation_is_an_invalid_instruction(
    params: dict[str, object], field: str
) -> None:
    """What build_executor_instruction refuses is refused at intake as invalid_instruction,
    naming the field and carrying the INSTRUCTION_REJECTED reason code."""
    with pytest.raises(RequestError, match=rf"^{re.escape(field)}: ") as info:
        parse_turn_request(params)
    error = info.value
    assert error.code == "invalid_instruction"
    assert error.details == {"field": field, "reason_code": reason_codes.INSTRUCTION_REJECTED}


@pytest.mark.parametrize("timeout_ms", [1, 600_000], ids=["min", "max"])
def test_timeout_bounds_are_allowed(timeout_ms: int) -> None:
    """timeout_ms of 1 and of 600000 (ten minutes) are accepted for both kinds."""
    process = parse_turn_request(_process(timeout_ms=timeout_ms))
    assert process.process is not None
    assert process.process.timeout_ms == timeout_ms
    instruction = parse_turn_request(_instruction(timeout_ms=timeout_ms))
    assert instruction.instruction is not None
    assert instruction.instruction.timeout_ms == timeout_ms


@pytest.mark.parametrize("length", [1, 200], ids=["min", "max"])
def test_idempotency_key_bounds_are_allowed(length: int) -> None:
    """An idempotency key of 1 and of 200 characters is kept as given."""
    key = "k" * length
    assert parse_turn_request(_process(idempotency_key=key)).idempotency_key == key
    assert parse_turn_request(_instruction(idempotency_key=key)).idempotency_key == key
