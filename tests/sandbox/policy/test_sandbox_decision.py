"""Phase-21 decide_sandbox_outcome: the seed 000 section 6 decision table, row by row."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.context import FaultReport, SandboxContext, SandboxDecisionResult
from sandbox.policy.engine import decide_sandbox_outcome
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

F = ExecutionFaultType
D = SandboxDecision


def _ctx(attempt: int = 1, max_retries: int = 3) -> SandboxContext:
    return SandboxContext(
        execution_id="EXE-1",
        instruction_id="INS-1",
        attempt_number=attempt,
        max_retries=max_retries,
        timeout_ms=1000,
        timestamp="2026-01-25T16:00:00Z",
    )


def _fault(fault_type: ExecutionFaultType, attempt: int = 1) -> FaultReport:
    return FaultReport(
        fault_id="FLT-1",
        execution_id="EXE-1",
        fault_type=fault_type,
        fault_message="boom",
        occurred_at="2026-01-25T16:00:01Z",
        attempt_number=attempt,
    )


@pytest.mark.parametrize(
    ("fault_type", "attempt", "decision", "code"),
    [
        (F.CRASH, 1, D.RETRY, rc.RETRY_AFTER_CRASH),
        (F.CRASH, 2, D.RETRY, rc.RETRY_AFTER_CRASH),
        (F.CRASH, 3, D.TERMINATE, rc.CRASH_RETRY_LIMIT_REACHED),
        (F.TIMEOUT, 1, D.RETRY, rc.RETRY_AFTER_TIMEOUT),
        (F.TIMEOUT, 2, D.RETRY, rc.RETRY_AFTER_TIMEOUT),
        (F.TIMEOUT, 3, D.TERMINATE, rc.TIMEOUT_RETRY_LIMIT_REACHED),
        (F.PARTIAL, 1, D.TERMINATE, rc.PARTIAL_NOT_RETRYABLE),
        (F.PARTIAL, 3, D.TERMINATE, rc.PARTIAL_NOT_RETRYABLE),
        (F.INVALID_RESPONSE, 1, D.TERMINATE, rc.INVALID_RESPONSE_NOT_RETRYABLE),
        (F.INVALID_RESPONSE, 3, D.TERMINATE, rc.INVALID_RESPONSE_NOT_RETRYABLE),
        (F.RESOURCE_EXHAUSTED, 1, D.ESCALATE, rc.RESOURCE_EXHAUSTED_ESCALATE),
        (F.RESOURCE_EXHAUSTED, 3, D.ESCALATE, rc.RESOURCE_EXHAUSTED_ESCALATE),
        (F.SECURITY_VIOLATION, 1, D.TERMINATE, rc.SECURITY_VIOLATION_TERMINATE),
        (F.SECURITY_VIOLATION, 3, D.TERMINATE, rc.SECURITY_VIOLATION_TERMINATE),
    ],
)
def test_decision_table_row(
    fault_type: ExecutionFaultType, attempt: int, decision: SandboxDecision, code: str
) -> None:
    """Every row of seed 000 section 6 with max_retries = 3 gives its decision and reason code."""
    result = decide_sandbox_outcome(_fault(fault_type, attempt), _ctx(attempt))
    assert (result.decision, result.reason_code) == (decision, code)
    assert result.reason_description != ""


@pytest.mark.parametrize(
    ("fault_type", "decision", "code"),
    [
        (F.RESOURCE_EXHAUSTED, D.ESCALATE, rc.RESOURCE_EXHAUSTED_ESCALATE),
        (F.PARTIAL, D.TERMINATE, rc.PARTIAL_NOT_RETRYABLE),
        (F.INVALID_RESPONSE, D.TERMINATE, rc.INVALID_RESPONSE_NOT_RETRYABLE),
        (F.SECURITY_VIOLATION, D.TERMINATE, rc.SECURITY_VIOLATION_TERMINATE),
    ],
)
@pytest.mark.parametrize("attempt", [4, 10, 1000])
def test_any_attempt_rows_hold_beyond_the_budget(
    fault_type: ExecutionFaultType, decision: SandboxDecision, code: str, attempt: int
) -> None:
    """Seed 000's "Any | Any" rows hold at any attempt number, also beyond max_retries."""
    result = decide_sandbox_outcome(_fault(fault_type, attempt), _ctx(attempt))
    assert (result.decision, result.reason_code) == (decision, code)


def test_resource_exhausted_at_attempt_4_of_3_escalates() -> None:
    """The seed authors' case, literally: RESOURCE_EXHAUSTED, attempt 4 of 3 -> ESCALATE."""
    context = SandboxContext(
        execution_id="EXE-1",
        instruction_id="INS-1",
        attempt_number=4,
        max_retries=3,
        timeout_ms=1000,
        timestamp="2026-01-25T16:00:00Z",
    )
    result = decide_sandbox_outcome(_fault(F.RESOURCE_EXHAUSTED, 4), context)
    assert result.decision is D.ESCALATE
    assert result.retry_policy is RetryPolicy.HUMAN_DECISION


@pytest.mark.parametrize("fault_type", [F.CRASH, F.TIMEOUT])
def test_retryable_fault_beyond_the_budget_terminates_as_an_overrun(
    fault_type: ExecutionFaultType,
) -> None:
    """CRASH/TIMEOUT ">= max" is TERMINATE; beyond the budget the code says it was overrun."""
    result = decide_sandbox_outcome(_fault(fault_type, 4), _ctx(4))
    assert (result.decision, result.reason_code) == (D.TERMINATE, rc.DENY_ATTEMPT_LIMIT_EXCEEDED)
    assert result.retry_policy is RetryPolicy.NO_RETRY


def test_retry_result_carries_the_limited_policy() -> None:
    """A retried CRASH reports RETRY_LIMITED; the description names the attempt and budget."""
    result = decide_sandbox_outcome(_fault(F.CRASH, 2), _ctx(2))
    assert result.retry_policy is RetryPolicy.RETRY_LIMITED
    assert "2 of 3" in result.reason_description


def test_escalation_carries_the_human_decision_policy() -> None:
    """RESOURCE_EXHAUSTED escalates with HUMAN_DECISION (a person chooses retry or terminate)."""
    result = decide_sandbox_outcome(_fault(F.RESOURCE_EXHAUSTED), _ctx())
    assert result.retry_policy is RetryPolicy.HUMAN_DECISION


@pytest.mark.parametrize("max_retries", [1, 2, 5, 10])
def test_budget_follows_max_retries(max_retries: int) -> None:
    """RETRY while attempt < max_retries, TERMINATE at attempt == max_retries, for any budget."""
    for attempt in range(1, max_retries + 1):
        result = decide_sandbox_outcome(_fault(F.TIMEOUT, attempt), _ctx(attempt, max_retries))
        expected = D.RETRY if attempt < max_retries else D.TERMINATE
        assert result.decision is expected


def test_result_is_immutable() -> None:
    """SandboxDecisionResult is frozen (seed 000 section 8: Immutable)."""
    result = decide_sandbox_outcome(_fault(F.CRASH), _ctx())
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.decision = D.ESCALATE  # type: ignore[misc]


@pytest.mark.parametrize("cls", [SandboxContext, FaultReport, SandboxDecisionResult])
def test_records_are_frozen_and_slotted(cls: type) -> None:
    """The three Phase-21 records are frozen, slotted dataclasses."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    assert hasattr(cls, "__slots__")


def test_never_raises_on_garbage() -> None:
    """The engine answers TERMINATE for junk instead of raising."""
    cases: list[tuple[object, object]] = [
        (None, None),
        ("x", 1),
        (_fault(F.CRASH), "ctx"),
        ({}, _ctx()),
    ]
    for fault, context in cases:
        assert decide_sandbox_outcome(fault, context).decision is D.TERMINATE
