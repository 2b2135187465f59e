"""decide_attempt: the mapping of outcome x phase x attempt to a verdict (docs/policy.md,
"How the seeds combine")."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import (
    RETRYABLE_PHASES,
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    OutcomeKind,
    RetryOptions,
    Verdict,
    decide_attempt,
    outcome_from_response,
)
from sandbox.policy.envelopes import (
    ExecutionSafetyResult,
    ExecutorResponseEnvelope,
    ExecutorResponseType,
)
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

F = ExecutionFaultType
P = AgentPhase
OPTS = RetryOptions()


def _decide(outcome: object, phase: object, attempt: object = 1, **kw: object) -> AttemptDecision:
    return decide_attempt(outcome, phase=phase, attempt_number=attempt, options=OPTS, **kw)


# ----------------------------------------------------------------- from_exit_code
@pytest.mark.parametrize(
    ("kwargs", "kind", "fault"),
    [
        ({"exit_code": 0}, OutcomeKind.SUCCESS, None),
        ({"exit_code": 1}, OutcomeKind.FAILURE, None),
        ({"exit_code": 2}, OutcomeKind.FAILURE, None),
        ({"exit_code": 137}, OutcomeKind.FAILURE, None),
        ({"exit_code": 124}, OutcomeKind.FAULT, F.TIMEOUT),
        ({"exit_code": 125}, OutcomeKind.FAULT, F.CRASH),
        ({"exit_code": 128}, OutcomeKind.FAULT, F.CRASH),
        ({"exit_code": -9}, OutcomeKind.FAULT, F.CRASH),
        ({"exit_code": None}, OutcomeKind.FAULT, F.CRASH),
        ({"exit_code": 0, "timed_out": True}, OutcomeKind.FAULT, F.TIMEOUT),
        ({"exit_code": None, "killed_by_signal": 9}, OutcomeKind.FAULT, F.CRASH),
        (
            {"exit_code": None, "killed_by_signal": 9, "timed_out": True},
            OutcomeKind.FAULT,
            F.TIMEOUT,
        ),
        (
            {"exit_code": 137, "killed_by_signal": 9, "resource_exhausted": True},
            OutcomeKind.FAULT,
            F.RESOURCE_EXHAUSTED,
        ),
        (
            {"exit_code": 0, "resource_exhausted": True, "security_violation": True},
            OutcomeKind.FAULT,
            F.SECURITY_VIOLATION,
        ),
    ],
)
def test_from_exit_code(
    kwargs: dict[str, object], kind: OutcomeKind, fault: ExecutionFaultType | None
) -> None:
    """Process endings map as docs/policy.md says (item 3): breach > limit > deadline > signal
    > code."""
    outcome = AttemptOutcome.from_exit_code(**kwargs)  # type: ignore[arg-type]
    assert (outcome.kind, outcome.fault_type) == (kind, fault)


def test_constructors() -> None:
    """The four constructors build the four kinds."""
    assert AttemptOutcome.success() == AttemptOutcome(OutcomeKind.SUCCESS, exit_code=0)
    assert AttemptOutcome.failure(3, "x").exit_code == 3
    assert AttemptOutcome.fault(F.PARTIAL).fault_type is F.PARTIAL
    assert AttemptOutcome.refused("no").message == "no"


# ----------------------------------------------------------------- success / refused
@pytest.mark.parametrize("phase", [*AgentPhase, None])
def test_success_succeeds_in_every_phase(phase: AgentPhase | None) -> None:
    """SUCCESS is SUCCEED with ATTEMPT_SUCCEEDED whatever the phase."""
    decision = _decide(AttemptOutcome.success(), phase, 2)
    assert (decision.verdict, decision.reason_code) == (Verdict.SUCCEED, rc.ATTEMPT_SUCCEEDED)
    assert decision.delay_ms == 0


@pytest.mark.parametrize("phase", [*AgentPhase, None])
def test_refused_terminates_without_retry(phase: AgentPhase | None) -> None:
    """REFUSED is TERMINATE with EXECUTOR_REFUSED, never retried."""
    decision = _decide(AttemptOutcome.refused(), phase)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, rc.EXECUTOR_REFUSED)
    assert decision.retry_policy is RetryPolicy.NO_RETRY


# ----------------------------------------------------------------- persistent failure
@pytest.mark.parametrize("phase", [P.GREEN, P.VERIFY])
def test_persistent_failure_retried_then_exhausted(phase: AgentPhase) -> None:
    """In GREEN/VERIFY a failure retries at 1 and 2 (500, 1000 ms) and is EXHAUSTED at 3."""
    assert phase in RETRYABLE_PHASES
    failure = AttemptOutcome.failure(1)
    first, second, third = (_decide(failure, phase, n) for n in (1, 2, 3))
    assert (first.verdict, first.reason_code, first.delay_ms) == (
        Verdict.RETRY,
        rc.PERSISTENT_FAILURE_RETRY,
        500,
    )
    assert (second.verdict, second.delay_ms) == (Verdict.RETRY, 1000)
    assert (third.verdict, third.reason_code) == (Verdict.EXHAUSTED, rc.RETRY_BUDGET_EXHAUSTED)
    assert third.record_entropy
    assert not first.record_entropy
    assert not second.record_entropy


@pytest.mark.parametrize("phase", [P.RED, P.REFACTOR])
def test_failure_in_red_and_refactor_is_not_retried(phase: AgentPhase) -> None:
    """In RED/REFACTOR a failure ends the turn: TERMINATE PHASE_NOT_RETRYABLE."""
    decision = _decide(AttemptOutcome.failure(1), phase)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, rc.PHASE_NOT_RETRYABLE)
    assert not decision.record_entropy


def test_failure_without_phase_is_not_retried() -> None:
    """With no phase Phase-21 alone decides; it has no rule for failures: FAILURE_NOT_RETRIED."""
    decision = _decide(AttemptOutcome.failure(2), None)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, rc.FAILURE_NOT_RETRIED)


def test_failure_without_exit_code_is_persistent() -> None:
    """An executor FAILURE (no exit code) is a persistent failure."""
    decision = _decide(AttemptOutcome.failure(None), P.GREEN)
    assert decision.reason_code == rc.PERSISTENT_FAILURE_RETRY


# ----------------------------------------------------------------- faults and transient codes
@pytest.mark.parametrize(("code", "fault"), [(124, F.TIMEOUT), (125, F.CRASH), (127, F.CRASH)])
def test_transient_exit_code_is_treated_as_its_fault(code: int, fault: ExecutionFaultType) -> None:
    """A FAILURE with a transient code goes through Phase-21 as TIMEOUT/CRASH."""
    decision = _decide(AttemptOutcome.failure(code), P.GREEN)
    assert decision.verdict is Verdict.RETRY
    assert decision.fault_type is fault
    assert decision.sandbox_decision is SandboxDecision.RETRY
    last = _decide(AttemptOutcome.failure(code), P.GREEN, 3)
    assert last.verdict is Verdict.TERMINATE
    assert not last.record_entropy


@pytest.mark.parametrize("phase", [P.GREEN, P.VERIFY, None])
def test_crash_retried_where_retry_is_allowed(phase: AgentPhase | None) -> None:
    """A CRASH is RETRY (with backoff) in GREEN, VERIFY and with no phase."""
    decision = _decide(AttemptOutcome.fault(F.CRASH), phase, 2)
    assert (decision.verdict, decision.reason_code, decision.delay_ms) == (
        Verdict.RETRY,
        rc.RETRY_AFTER_CRASH,
        1000,
    )


@pytest.mark.parametrize("phase", [P.RED, P.REFACTOR])
def test_retryable_fault_in_red_or_refactor_terminates(phase: AgentPhase) -> None:
    """A TIMEOUT in RED/REFACTOR is TERMINATE PHASE_NOT_RETRYABLE; the engine's RETRY is kept."""
    decision = _decide(AttemptOutcome.fault(F.TIMEOUT), phase)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, rc.PHASE_NOT_RETRYABLE)
    assert decision.sandbox_decision is SandboxDecision.RETRY
    assert decision.delay_ms == 0
    assert "not" in decision.reason


@pytest.mark.parametrize("phase", [*AgentPhase, None])
def test_resource_exhausted_escalates_in_every_phase(phase: AgentPhase | None) -> None:
    """RESOURCE_EXHAUSTED is ESCALATE whatever the phase."""
    decision = _decide(AttemptOutcome.fault(F.RESOURCE_EXHAUSTED), phase)
    assert (decision.verdict, decision.reason_code) == (
        Verdict.ESCALATE,
        rc.RESOURCE_EXHAUSTED_ESCALATE,
    )


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (F.SECURITY_VIOLATION, rc.SECURITY_VIOLATION_TERMINATE),
        (F.PARTIAL, rc.PARTIAL_NOT_RETRYABLE),
        (F.INVALID_RESPONSE, rc.INVALID_RESPONSE_NOT_RETRYABLE),
    ],
)
def test_non_retryable_faults_terminate(fault: ExecutionFaultType, code: str) -> None:
    """SECURITY_VIOLATION, PARTIAL and INVALID_RESPONSE terminate even in GREEN."""
    decision = _decide(AttemptOutcome.fault(fault), P.GREEN)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, code)


def test_custom_budget_and_backoff() -> None:
    """max_attempts, base delay, multiplier and cap come from RetryOptions."""
    options = RetryOptions(
        max_attempts=5, base_delay_ms=100, backoff_multiplier=3, max_delay_ms=1000
    )
    delays = [
        decide_attempt(
            AttemptOutcome.failure(1), phase=P.VERIFY, attempt_number=n, options=options
        ).delay_ms
        for n in range(1, 5)
    ]
    assert delays == [100, 300, 900, 1000]
    last = decide_attempt(
        AttemptOutcome.failure(1), phase=P.VERIFY, attempt_number=5, options=options
    )
    assert last.verdict is Verdict.EXHAUSTED


# ----------------------------------------------------------------- deny by default
@pytest.mark.parametrize(
    "outcome",
    [
        None,
        "SUCCESS",
        {"kind": "SUCCESS"},
        AttemptOutcome("SUCCESS"),  # type: ignore[arg-type]
        AttemptOutcome(OutcomeKind.FAILURE, exit_code=0),
        AttemptOutcome(OutcomeKind.FAILURE, exit_code="1"),  # type: ignore[arg-type]
        AttemptOutcome(OutcomeKind.FAILURE, exit_code=True),
    ],
)
def test_malformed_outcome_is_denied(outcome: object) -> None:
    """Anything that is not a consistent AttemptOutcome is TERMINATE DENY_OUTCOME_MALFORMED."""
    decision = _decide(outcome, P.GREEN)
    assert (decision.verdict, decision.reason_code) == (
        Verdict.TERMINATE,
        rc.DENY_OUTCOME_MALFORMED,
    )


@pytest.mark.parametrize("phase", ["GREEN", "green", 1, SandboxDecision.RETRY])
def test_unknown_phase_is_denied(phase: object) -> None:
    """A phase that is not an AgentPhase (even its name as a string) is DENY_PHASE_UNKNOWN."""
    assert _decide(AttemptOutcome.success(), phase).reason_code == rc.DENY_PHASE_UNKNOWN


def test_options_must_be_retry_options() -> None:
    """Options that are not RetryOptions are DENY_OPTIONS_INVALID."""
    decision = decide_attempt(
        AttemptOutcome.success(), phase=P.GREEN, attempt_number=1, options={"max_attempts": 99}
    )
    assert decision.reason_code == rc.DENY_OPTIONS_INVALID


@pytest.mark.parametrize(
    ("outcome", "attempt", "code"),
    [
        (AttemptOutcome.success(), 0, rc.DENY_ATTEMPT_NUMBER_INVALID),
        (AttemptOutcome.failure(1), "1", rc.DENY_ATTEMPT_NUMBER_INVALID),
        (AttemptOutcome.fault(F.CRASH), -1, rc.DENY_ATTEMPT_NUMBER_INVALID),
        (AttemptOutcome.refused(), 4, rc.DENY_ATTEMPT_LIMIT_EXCEEDED),
        (AttemptOutcome.failure(1), 4, rc.DENY_ATTEMPT_LIMIT_EXCEEDED),
        (AttemptOutcome.success(), 4, rc.DENY_ATTEMPT_LIMIT_EXCEEDED),
        (AttemptOutcome.fault(F.CRASH), 4, rc.DENY_ATTEMPT_LIMIT_EXCEEDED),
        (AttemptOutcome.fault(F.TIMEOUT), 4, rc.DENY_ATTEMPT_LIMIT_EXCEEDED),
    ],
)
def test_bad_attempt_number_is_denied(outcome: AttemptOutcome, attempt: object, code: str) -> None:
    """Attempt numbers below 1, mistyped or beyond the budget are denied (but see below)."""
    decision = _decide(outcome, P.GREEN, attempt)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, code)


@pytest.mark.parametrize("phase", [None, *AgentPhase])
def test_resource_exhausted_at_attempt_4_of_3_escalates(phase: AgentPhase | None) -> None:
    """Seed 000 "Any": RESOURCE_EXHAUSTED on attempt 4 of 3 escalates, in every phase."""
    decision = _decide(AttemptOutcome.fault(F.RESOURCE_EXHAUSTED), phase, 4)
    assert (decision.verdict, decision.reason_code) == (
        Verdict.ESCALATE,
        rc.RESOURCE_EXHAUSTED_ESCALATE,
    )
    assert decision.sandbox_decision is SandboxDecision.ESCALATE
    assert decision.retry_policy is RetryPolicy.HUMAN_DECISION


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (F.PARTIAL, rc.PARTIAL_NOT_RETRYABLE),
        (F.INVALID_RESPONSE, rc.INVALID_RESPONSE_NOT_RETRYABLE),
        (F.SECURITY_VIOLATION, rc.SECURITY_VIOLATION_TERMINATE),
    ],
)
def test_any_attempt_terminations_keep_their_code_beyond_the_budget(
    fault: ExecutionFaultType, code: str
) -> None:
    """The other "Any" rows terminate beyond the budget with their own reason code."""
    decision = _decide(AttemptOutcome.fault(fault), P.GREEN, 4)
    assert (decision.verdict, decision.reason_code) == (Verdict.TERMINATE, code)


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_last_attempt_is_decided_not_denied(max_attempts: int) -> None:
    """attempt_number == max_attempts is the last attempt, not an overrun: it may succeed, and
    a failure there is EXHAUSTED (GREEN) or the fault's limit code, never an overrun denial."""
    options = RetryOptions(max_attempts=max_attempts)

    def last(outcome: AttemptOutcome) -> AttemptDecision:
        return decide_attempt(outcome, phase=P.GREEN, attempt_number=max_attempts, options=options)

    assert last(AttemptOutcome.success()).verdict is Verdict.SUCCEED
    assert last(AttemptOutcome.failure(1)).reason_code == rc.RETRY_BUDGET_EXHAUSTED
    assert last(AttemptOutcome.fault(F.CRASH)).reason_code == rc.CRASH_RETRY_LIMIT_REACHED
    assert last(AttemptOutcome.fault(F.TIMEOUT)).reason_code == rc.TIMEOUT_RETRY_LIMIT_REACHED
    assert last(AttemptOutcome.refused()).reason_code == rc.EXECUTOR_REFUSED


@pytest.mark.parametrize("fault", [None, "CRASH", 3])
def test_fault_outcome_with_unknown_type_is_denied(fault: object) -> None:
    """A FAULT outcome without a real ExecutionFaultType is denied by the Phase-21 engine."""
    outcome = AttemptOutcome(OutcomeKind.FAULT, fault_type=fault)  # type: ignore[arg-type]
    decision = _decide(outcome, P.GREEN)
    assert (decision.verdict, decision.reason_code) == (
        Verdict.TERMINATE,
        rc.DENY_FAULT_TYPE_UNKNOWN,
    )
    assert decision.fault_type is None


def test_ids_are_passed_to_the_engine() -> None:
    """Given ids must be valid strings: a non-str execution id is denied by the engine."""
    ok = _decide(AttemptOutcome.fault(F.CRASH), P.GREEN, execution_id="EXE-1", instruction_id="I")
    assert ok.verdict is Verdict.RETRY
    bad = _decide(AttemptOutcome.fault(F.CRASH), P.GREEN, execution_id=5)
    assert bad.reason_code == rc.DENY_EXECUTION_ID_INVALID


def test_decision_is_frozen_and_serialisable() -> None:
    """AttemptDecision is frozen and to_dict gives JSON-ready strings."""
    decision = _decide(AttemptOutcome.fault(F.TIMEOUT), P.GREEN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.verdict = Verdict.SUCCEED  # type: ignore[misc]
    assert decision.to_dict() == {
        "verdict": "RETRY",
        "reason_code": rc.RETRY_AFTER_TIMEOUT,
        "reason": decision.reason,
        "delay_ms": 500,
        "fault_type": "TIMEOUT",
        "sandbox_decision": "RETRY",
        "retry_policy": "RETRY_LIMITED",
        "record_entropy": False,
    }
    assert _decide(AttemptOutcome.success(), None).to_dict()["fault_type"] is None


# ----------------------------------------------------------------- executor responses
def _safe(kind: ExecutorResponseType, *, partial: bool = False) -> ExecutionSafetyResult:
    envelope = ExecutorResponseEnvelope(
        instruction_id="I",
        response_type=kind,
        evidence_hash="a" * 64,
        error_message="msg",
        timestamp="t",
        partial=partial,
    )
    return ExecutionSafetyResult(
        is_safe=True, reason_code=rc.RESPONSE_ACCEPTED, reason_description="ok", response=envelope
    )


@pytest.mark.parametrize(
    ("result", "kind", "fault"),
    [
        (_safe(ExecutorResponseType.SUCCESS), OutcomeKind.SUCCESS, None),
        (_safe(ExecutorResponseType.SUCCESS, partial=True), OutcomeKind.FAULT, F.PARTIAL),
        (_safe(ExecutorResponseType.FAILURE), OutcomeKind.FAILURE, None),
        (_safe(ExecutorResponseType.TIMEOUT), OutcomeKind.FAULT, F.TIMEOUT),
        (_safe(ExecutorResponseType.ERROR), OutcomeKind.FAULT, F.CRASH),
        (_safe(ExecutorResponseType.REFUSED), OutcomeKind.REFUSED, None),
        (
            ExecutionSafetyResult(False, rc.RESPONSE_CLAIMS_AUTHORITY, "x", None),
            OutcomeKind.FAULT,
            F.SECURITY_VIOLATION,
        ),
        (
            ExecutionSafetyResult(False, rc.SUCCESS_WITHOUT_EVIDENCE, "x", None),
            OutcomeKind.FAULT,
            F.INVALID_RESPONSE,
        ),
        (
            ExecutionSafetyResult(True, rc.RESPONSE_ACCEPTED, "x", None),
            OutcomeKind.FAULT,
            F.INVALID_RESPONSE,
        ),
    ],
)
def test_outcome_from_response(
    result: ExecutionSafetyResult, kind: OutcomeKind, fault: ExecutionFaultType | None
) -> None:
    """Executor responses map to outcomes as docs/policy.md says (item 4)."""
    outcome = outcome_from_response(result)
    assert (outcome.kind, outcome.fault_type) == (kind, fault)


def test_executor_failure_is_retried_in_green() -> None:
    """An executor FAILURE in GREEN is a persistent failure, retried with backoff."""
    outcome = outcome_from_response(_safe(ExecutorResponseType.FAILURE))
    assert _decide(outcome, P.GREEN).verdict is Verdict.RETRY


class HostileRepr:
    """An object whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("boom")


def test_decide_attempt_never_raises_on_hostile_values() -> None:
    """Hostile outcome, phase or exit code values are denied, never raised."""
    assert _decide(HostileRepr(), P.GREEN).reason == "outcome is a HostileRepr"
    assert _decide(AttemptOutcome.success(), HostileRepr()).reason == "unknown phase a HostileRepr"
    outcome = AttemptOutcome(OutcomeKind.FAILURE, exit_code=HostileRepr())  # type: ignore[arg-type]
    assert _decide(outcome, P.GREEN).reason == "failure with exit code a HostileRepr"
