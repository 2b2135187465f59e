"""Phase-21 classify_fault: the retry policy of every fault type (seed 000 sections 1 and 3)."""

from __future__ import annotations

import pytest

from sandbox.policy.context import SandboxContext
from sandbox.policy.engine import classify_fault
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy


def _ctx(**changes: object) -> SandboxContext:
    fields: dict[str, object] = {
        "execution_id": "EXE-1",
        "instruction_id": "INS-1",
        "attempt_number": 1,
        "max_retries": 3,
        "timeout_ms": 1000,
        "timestamp": "2026-01-25T16:00:00Z",
    }
    fields.update(changes)
    return SandboxContext(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault_type", "policy"),
    [
        (ExecutionFaultType.CRASH, RetryPolicy.RETRY_LIMITED),
        (ExecutionFaultType.TIMEOUT, RetryPolicy.RETRY_LIMITED),
        (ExecutionFaultType.PARTIAL, RetryPolicy.NO_RETRY),
        (ExecutionFaultType.INVALID_RESPONSE, RetryPolicy.NO_RETRY),
        (ExecutionFaultType.RESOURCE_EXHAUSTED, RetryPolicy.HUMAN_DECISION),
        (ExecutionFaultType.SECURITY_VIOLATION, RetryPolicy.NO_RETRY),
    ],
)
def test_every_fault_type_has_its_seed_policy(
    fault_type: ExecutionFaultType, policy: RetryPolicy
) -> None:
    """Each of the six fault types maps to the retry policy of seed 000 section 1."""
    assert classify_fault(fault_type, _ctx()) is policy


def test_classification_covers_the_closed_enum() -> None:
    """Every member of the closed fault enum is classified (no member is left out)."""
    assert {classify_fault(f, _ctx()) for f in ExecutionFaultType} <= set(RetryPolicy)
    assert len(ExecutionFaultType) == 6


def test_retry_once_is_never_produced_by_the_table() -> None:
    """RETRY_ONCE exists in the closed vocabulary but the seed-000 table never yields it."""
    assert RetryPolicy.RETRY_ONCE not in {classify_fault(f, _ctx()) for f in ExecutionFaultType}


def test_policy_does_not_depend_on_the_attempt_number() -> None:
    """The policy is the fault's class; the budget is judged by is_retry_allowed."""
    last = _ctx(attempt_number=3)
    assert classify_fault(ExecutionFaultType.CRASH, last) is RetryPolicy.RETRY_LIMITED


@pytest.mark.parametrize("fault_type", ["CRASH", 1, None, object(), RetryPolicy.RETRY_LIMITED])
def test_unknown_fault_type_is_no_retry(fault_type: object) -> None:
    """A value that is not an ExecutionFaultType (even its name as a string) is NO_RETRY."""
    assert classify_fault(fault_type, _ctx()) is RetryPolicy.NO_RETRY


@pytest.mark.parametrize(
    "context",
    [
        None,
        {"attempt_number": 1},
        _ctx(attempt_number=0),
        _ctx(max_retries=0),
        _ctx(execution_id=""),
        _ctx(timeout_ms=-5),
    ],
)
def test_malformed_context_is_no_retry(context: object) -> None:
    """A CRASH in a context that cannot be trusted is never classified as retryable."""
    assert classify_fault(ExecutionFaultType.CRASH, context) is RetryPolicy.NO_RETRY


def test_enum_values_are_member_names() -> None:
    """Enum values are the member names, so they go to ledgers and the wire unchanged."""
    for member in ExecutionFaultType:
        assert member.value == member.name
