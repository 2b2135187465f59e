"""An executor's ``retry_after_ms`` (FAILURE/ERROR): validated by the Phase-20 rules, carried
to the outcome, honoured by `decide_attempt` within ``max_delay_ms``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptOutcome,
    RetryOptions,
    Verdict,
    decide_attempt,
    outcome_from_response,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import (
    MAX_RETRY_AFTER_MS,
    build_executor_instruction,
    response_to_wire,
    validate_executor_response,
)

INSTRUCTION = build_executor_instruction(
    instruction_id="INS-1-1",
    execution_id="EXE-1",
    command_type="READ",
    target_selector="h1",
    timestamp="2026-01-01T00:00:00Z",
    timeout_ms=1000,
)


def response(response_type: str, **extra: Any) -> dict[str, Any]:
    return {"instruction_id": "INS-1-1", "response_type": response_type, **extra}


@pytest.mark.parametrize("value", [0, 1, 1500, MAX_RETRY_AFTER_MS])
def test_a_valid_retry_after_is_accepted_and_round_trips(value: int) -> None:
    """A non-negative int up to the bound is accepted and kept on the envelope."""
    result = validate_executor_response(INSTRUCTION, response("ERROR", retry_after_ms=value))
    assert result.is_safe
    assert result.response is not None
    assert result.response.retry_after_ms == value
    assert response_to_wire(result.response)["retry_after_ms"] == value


@pytest.mark.parametrize("value", [-1, MAX_RETRY_AFTER_MS + 1, True, 1.5, "100", [100]])
def test_a_bad_retry_after_is_denied(value: object) -> None:
    """Negative, too large or not an int (bool, float, string): the response is denied."""
    result = validate_executor_response(INSTRUCTION, response("FAILURE", retry_after_ms=value))
    assert not result.is_safe
    assert result.reason_code == rc.RESPONSE_FIELD_TYPE_INVALID
    assert "retry_after_ms" in result.reason_description


def test_null_or_absent_retry_after_means_no_say() -> None:
    """``null`` and an absent field both leave the wait to the backoff schedule."""
    for body in (response("ERROR", retry_after_ms=None), response("ERROR")):
        result = validate_executor_response(INSTRUCTION, body)
        assert result.response is not None
        assert result.response.retry_after_ms is None
        assert "retry_after_ms" not in response_to_wire(result.response)


@pytest.mark.parametrize(
    ("response_type", "carried"),
    [("FAILURE", 700), ("ERROR", 700), ("TIMEOUT", None), ("REFUSED", None)],
)
def test_only_failure_and_error_carry_it_to_the_outcome(
    response_type: str, carried: int | None
) -> None:
    """FAILURE and ERROR carry the executor's wait; other answers' is ignored."""
    result = validate_executor_response(INSTRUCTION, response(response_type, retry_after_ms=700))
    assert outcome_from_response(result).retry_after_ms == carried


def test_retry_after_replaces_the_backoff_for_a_crash() -> None:
    """ERROR (CRASH) with retry_after_ms=1500: RETRY after 1500 ms, not the seed's 500 ms."""
    outcome = AttemptOutcome(
        AttemptOutcome.fault(ExecutionFaultType.CRASH).kind,
        fault_type=ExecutionFaultType.CRASH,
        retry_after_ms=1500,
    )
    decision = decide_attempt(outcome, phase=None, attempt_number=1, options=RetryOptions())
    assert (decision.verdict, decision.reason_code, decision.delay_ms) == (
        Verdict.RETRY,
        rc.RETRY_AFTER_CRASH,
        1500,
    )


def test_retry_after_does_not_make_a_failure_retryable() -> None:
    """The executor says when, never whether: a FAILURE with no phase still terminates."""
    outcome = AttemptOutcome.failure(None)
    outcome = AttemptOutcome(outcome.kind, retry_after_ms=10)
    decision = decide_attempt(outcome, phase=None, attempt_number=1, options=RetryOptions())
    assert decision.verdict is Verdict.TERMINATE
    assert decision.reason_code == rc.FAILURE_NOT_RETRIED


@given(
    retry_after=st.one_of(st.none(), st.integers(-10, 10 * MAX_RETRY_AFTER_MS)),
    max_delay=st.integers(0, 120_000),
    attempt=st.integers(1, 2),
    fault=st.booleans(),
)
def test_the_wait_never_exceeds_max_delay(
    retry_after: int | None, max_delay: int, attempt: int, fault: bool
) -> None:
    """Whatever the executor asks, a RETRY waits at most ``max_delay_ms``; a valid ask below
    the cap is honoured exactly; no ask (or a negative one) keeps the backoff schedule."""
    options = RetryOptions(max_delay_ms=max_delay)
    if fault:
        outcome = AttemptOutcome(
            AttemptOutcome.fault(ExecutionFaultType.CRASH).kind,
            fault_type=ExecutionFaultType.CRASH,
            retry_after_ms=retry_after,
        )
    else:
        outcome = AttemptOutcome(AttemptOutcome.failure(None).kind, retry_after_ms=retry_after)
    decision = decide_attempt(
        outcome, phase=AgentPhase.GREEN, attempt_number=attempt, options=options
    )
    assert decision.verdict is Verdict.RETRY
    assert 0 <= decision.delay_ms <= max_delay
    if retry_after is not None and retry_after >= 0:
        assert decision.delay_ms == min(retry_after, max_delay)
    else:
        assert decision.delay_ms == options.delay_ms(attempt)
