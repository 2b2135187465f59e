"""Phase-21 deny by default: unknown or malformed input is TERMINATE with a reason code."""

from __future__ import annotations

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.context import FaultReport, SandboxContext
from sandbox.policy.engine import context_problem, decide_sandbox_outcome
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

F = ExecutionFaultType


def _ctx(**changes: object) -> SandboxContext:
    fields: dict[str, object] = {
        "execution_id": "EXE-1",
        "instruction_id": "INS-1",
        "attempt_number": 1,
        "max_retries": 3,
        "timeout_ms": 1000,
        "timestamp": "t",
    }
    fields.update(changes)
    return SandboxContext(**fields)  # type: ignore[arg-type]


def _fault(fault_type: object = F.CRASH, **changes: object) -> FaultReport:
    fields: dict[str, object] = {
        "fault_id": "FLT-1",
        "execution_id": "EXE-1",
        "fault_type": fault_type,
        "fault_message": "boom",
        "occurred_at": "t",
        "attempt_number": 1,
    }
    fields.update(changes)
    return FaultReport(**fields)  # type: ignore[arg-type]


def _assert_denied(fault: object, context: object, code: str) -> None:
    result = decide_sandbox_outcome(fault, context)
    assert result.decision is SandboxDecision.TERMINATE
    assert result.retry_policy is RetryPolicy.NO_RETRY
    assert result.reason_code == code


@pytest.mark.parametrize("fault", [None, "CRASH", {"fault_type": "CRASH"}, 3, F.CRASH])
def test_fault_that_is_not_a_fault_report_is_denied(fault: object) -> None:
    """Anything but a FaultReport is DENY_FAULT_MALFORMED."""
    _assert_denied(fault, _ctx(), rc.DENY_FAULT_MALFORMED)


@pytest.mark.parametrize("fault_type", ["CRASH", "crash", 1, None, SandboxDecision.RETRY])
def test_unknown_fault_type_is_denied(fault_type: object) -> None:
    """A str where the enum is expected (or any non-member) is DENY_FAULT_TYPE_UNKNOWN."""
    _assert_denied(_fault(fault_type), _ctx(), rc.DENY_FAULT_TYPE_UNKNOWN)


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"execution_id": ""}, rc.DENY_EXECUTION_ID_INVALID),
        ({"execution_id": 7}, rc.DENY_EXECUTION_ID_INVALID),
        ({"instruction_id": ""}, rc.DENY_INSTRUCTION_ID_INVALID),
        ({"instruction_id": None}, rc.DENY_INSTRUCTION_ID_INVALID),
        ({"attempt_number": 0}, rc.DENY_ATTEMPT_NUMBER_INVALID),
        ({"attempt_number": -3}, rc.DENY_ATTEMPT_NUMBER_INVALID),
        ({"attempt_number": True}, rc.DENY_ATTEMPT_NUMBER_INVALID),
        ({"attempt_number": "1"}, rc.DENY_ATTEMPT_NUMBER_INVALID),
        ({"attempt_number": 1.0}, rc.DENY_ATTEMPT_NUMBER_INVALID),
        ({"max_retries": 0}, rc.DENY_MAX_RETRIES_INVALID),
        ({"max_retries": -1}, rc.DENY_MAX_RETRIES_INVALID),
        ({"max_retries": "3"}, rc.DENY_MAX_RETRIES_INVALID),
        ({"max_retries": False}, rc.DENY_MAX_RETRIES_INVALID),
        ({"timeout_ms": 0}, rc.DENY_TIMEOUT_INVALID),
        ({"timeout_ms": -1}, rc.DENY_TIMEOUT_INVALID),
        ({"timeout_ms": 2.5}, rc.DENY_TIMEOUT_INVALID),
        ({"timestamp": None}, rc.DENY_TIMESTAMP_INVALID),
    ],
)
def test_malformed_context_is_denied(changes: dict[str, object], code: str) -> None:
    """Each malformed context field has its own DENY_* reason code."""
    _assert_denied(_fault(), _ctx(**changes), code)


@pytest.mark.parametrize("context", [None, {"attempt_number": 1}, "ctx", 42])
def test_context_that_is_not_a_sandbox_context_is_denied(context: object) -> None:
    """A dict or any other object in place of SandboxContext is DENY_CONTEXT_MALFORMED."""
    _assert_denied(_fault(), context, rc.DENY_CONTEXT_MALFORMED)


def test_fault_from_another_execution_is_denied() -> None:
    """A fault whose execution_id differs from the context's is DENY_EXECUTION_ID_MISMATCH."""
    _assert_denied(_fault(execution_id="EXE-2"), _ctx(), rc.DENY_EXECUTION_ID_MISMATCH)


def test_fault_for_another_attempt_is_denied() -> None:
    """fault.attempt_number != context.attempt_number is DENY_ATTEMPT_NUMBER_MISMATCH."""
    _assert_denied(_fault(attempt_number=2), _ctx(), rc.DENY_ATTEMPT_NUMBER_MISMATCH)


@pytest.mark.parametrize(
    "changes",
    [
        {"fault_id": None},
        {"fault_message": 5},
        {"occurred_at": b"t"},
        {"execution_id": None},
        {"attempt_number": "1"},
        {"attempt_number": True},
    ],
)
def test_fault_with_mistyped_field_is_denied(changes: dict[str, object]) -> None:
    """A FaultReport whose fields have the wrong types is DENY_FAULT_MALFORMED."""
    _assert_denied(_fault(**changes), _ctx(), rc.DENY_FAULT_MALFORMED)


@pytest.mark.parametrize("fault_type", [F.CRASH, F.TIMEOUT])
def test_attempt_beyond_budget_is_denied(fault_type: ExecutionFaultType) -> None:
    """attempt_number > max_retries for a retryable fault: the limit was overrun, denied."""
    context = _ctx(attempt_number=4)
    _assert_denied(_fault(fault_type, attempt_number=4), context, rc.DENY_ATTEMPT_LIMIT_EXCEEDED)


def test_resource_exhausted_beyond_budget_still_escalates() -> None:
    """Seed 000 says "Any" attempt for RESOURCE_EXHAUSTED: an overrun budget still escalates."""
    result = decide_sandbox_outcome(
        _fault(F.RESOURCE_EXHAUSTED, attempt_number=4), _ctx(attempt_number=4)
    )
    assert (result.decision, result.reason_code) == (
        SandboxDecision.ESCALATE,
        rc.RESOURCE_EXHAUSTED_ESCALATE,
    )


def test_security_violation_wins_over_malformed_context() -> None:
    """SECURITY_VIOLATION terminates immediately and is reported as such, whatever the context."""
    result = decide_sandbox_outcome(_fault(F.SECURITY_VIOLATION), None)
    assert result.decision is SandboxDecision.TERMINATE
    assert result.reason_code == rc.SECURITY_VIOLATION_TERMINATE


def test_context_problem_is_none_for_a_good_context() -> None:
    """context_problem returns None for a well-formed context and (code, text) otherwise."""
    assert context_problem(_ctx()) is None
    assert context_problem(_ctx(max_retries=0)) == (
        rc.DENY_MAX_RETRIES_INVALID,
        "max_retries must be an int >= 1",
    )


def test_every_deny_code_is_a_registered_reason_code() -> None:
    """The DENY_* codes the engine emits are all in ALL_REASON_CODES."""
    deny = {code for code in rc.ALL_REASON_CODES if code.startswith("DENY_")}
    assert rc.DENY_FAULT_MALFORMED in deny
    assert len(deny) >= 15


class HostileRepr:
    """An object whose repr raises, as hostile input might."""

    def __repr__(self) -> str:
        raise RuntimeError("boom")


def test_hostile_values_are_described_safely() -> None:
    """Denials describe junk by type name and never call its repr."""
    result = decide_sandbox_outcome(_fault(HostileRepr()), _ctx())
    assert result.reason_code == rc.DENY_FAULT_TYPE_UNKNOWN
    assert result.reason_description == "unknown fault type a HostileRepr"
