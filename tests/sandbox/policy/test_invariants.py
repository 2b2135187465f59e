"""Property tests of the five invariants of seed 002 section 5 over random faults and contexts."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.policy.attempts import (
    AgentPhase,
    AttemptOutcome,
    OutcomeKind,
    RetryOptions,
    Verdict,
    decide_attempt,
    outcome_from_response,
)
from sandbox.policy.context import FaultReport, SandboxContext
from sandbox.policy.engine import (
    context_problem,
    decide_sandbox_outcome,
    enforce_retry_limit,
    is_retry_allowed,
    retry_limit_overrun,
)
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision
from sandbox.policy.safety import (
    AUTHORITY_KEYS,
    build_executor_instruction,
    validate_executor_response,
)

F = ExecutionFaultType
PROPERTY = settings(max_examples=200, deadline=None, database=None)
JUNK = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=3)
)
IDS = st.sampled_from(["EXE-1", "EXE-2", ""])
INTS = st.one_of(st.integers(min_value=-3, max_value=12), JUNK)
FAULT_TYPES = st.one_of(st.sampled_from(ExecutionFaultType), JUNK, st.sampled_from(SandboxDecision))
PHASES = st.one_of(st.none(), st.sampled_from(AgentPhase))


@st.composite
def contexts(draw: st.DrawFn) -> object:
    """Mostly well-formed SandboxContexts, sometimes with junk fields, sometimes not one at all."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.one_of(JUNK, st.dictionaries(st.text(max_size=3), st.integers())))
    fields: dict[str, Any] = {
        "execution_id": draw(st.one_of(IDS, JUNK)) if draw(st.booleans()) else "EXE-1",
        "instruction_id": draw(st.one_of(st.just("INS-1"), JUNK)),
        "attempt_number": draw(INTS),
        "max_retries": draw(INTS),
        "timeout_ms": draw(st.one_of(st.integers(-5, 10_000), JUNK)),
        "timestamp": draw(st.one_of(st.just("t"), JUNK)),
    }
    return SandboxContext(**fields)


@st.composite
def faults(draw: st.DrawFn, fault_type: Any = FAULT_TYPES) -> object:
    """FaultReports of any (also unknown) type, for this or another execution and attempt."""
    if draw(st.integers(0, 19)) == 0:
        return draw(JUNK)
    fields: dict[str, Any] = {
        "fault_id": draw(st.one_of(st.just("F-1"), JUNK)),
        "execution_id": draw(st.one_of(IDS, JUNK)) if draw(st.booleans()) else "EXE-1",
        "fault_type": draw(fault_type),
        "fault_message": draw(st.one_of(st.text(max_size=10), JUNK)),
        "occurred_at": "t",
        "attempt_number": draw(INTS),
    }
    return FaultReport(**fields)


def _matched(fault: object, context: object) -> bool:
    return (
        isinstance(fault, FaultReport)
        and isinstance(context, SandboxContext)
        and context_problem(context) is None
        and fault.execution_id == context.execution_id
        and fault.attempt_number == context.attempt_number
    )


@PROPERTY
@given(fault=faults(), context=contexts())
def test_engine_never_raises_and_answers_in_the_closed_vocabulary(
    fault: object, context: object
) -> None:
    """For any input the engine answers a closed decision, a closed policy and a reason code."""
    result = decide_sandbox_outcome(fault, context)
    assert isinstance(result.decision, SandboxDecision)
    assert isinstance(result.retry_policy, RetryPolicy)
    assert result.reason_code.isupper()


@PROPERTY
@given(fault=faults(st.just(F.CRASH)), context=contexts(), phase=PHASES, attempt=INTS)
def test_invariant_1_crash_is_never_success(
    fault: object, context: object, phase: AgentPhase | None, attempt: object
) -> None:
    """Invariant 1: a CRASH is RETRY or TERMINATE, and never SUCCEED at the attempt level."""
    assert decide_sandbox_outcome(fault, context).decision is not SandboxDecision.ESCALATE
    outcome = AttemptOutcome.fault(F.CRASH)
    decision = decide_attempt(outcome, phase=phase, attempt_number=attempt, options=RetryOptions())
    assert decision.verdict in {Verdict.RETRY, Verdict.TERMINATE}


@PROPERTY
@given(
    fault=faults(st.just(F.TIMEOUT)),
    context=contexts(),
    phase=PHASES,
    attempt=INTS,
    exit_code=st.one_of(st.none(), st.integers(-300, 300)),
)
def test_invariant_2_timeout_is_never_success(
    fault: object, context: object, phase: AgentPhase | None, attempt: object, exit_code: int | None
) -> None:
    """Invariant 2: a TIMEOUT (or a deadline, whatever the exit code) is never SUCCEED."""
    assert decide_sandbox_outcome(fault, context).decision is not SandboxDecision.ESCALATE
    outcome = AttemptOutcome.from_exit_code(exit_code, timed_out=True)
    assert outcome.kind is OutcomeKind.FAULT
    decision = decide_attempt(outcome, phase=phase, attempt_number=attempt, options=RetryOptions())
    assert decision.verdict in {Verdict.RETRY, Verdict.TERMINATE}


@PROPERTY
@given(
    fault=faults(st.just(F.PARTIAL)),
    context=contexts(),
    phase=PHASES,
    attempt=INTS,
    response_type=st.sampled_from(["SUCCESS", "FAILURE", "TIMEOUT", "ERROR", "REFUSED"]),
)
def test_invariant_3_partial_is_never_success(
    fault: object, context: object, phase: AgentPhase | None, attempt: object, response_type: str
) -> None:
    """Invariant 3: PARTIAL always terminates, and a partial response is never a success."""
    assert decide_sandbox_outcome(fault, context).decision is SandboxDecision.TERMINATE
    decision = decide_attempt(
        AttemptOutcome.fault(F.PARTIAL), phase=phase, attempt_number=attempt, options=RetryOptions()
    )
    assert decision.verdict is Verdict.TERMINATE
    instruction = build_executor_instruction(
        instruction_id="I",
        execution_id="E",
        command_type="READ",
        target_selector="p",
        timestamp="t",
        timeout_ms=10,
    )
    response = {
        "instruction_id": "I",
        "response_type": response_type,
        "evidence_hash": "a" * 64,
        "partial": True,
    }
    outcome = outcome_from_response(validate_executor_response(instruction, response))
    assert outcome.kind is not OutcomeKind.SUCCESS


@PROPERTY
@given(fault=faults(), context=contexts())
def test_invariant_4_faults_never_escalate_privileges(fault: object, context: object) -> None:
    """Invariant 4: only a matching CRASH/TIMEOUT retries, only RESOURCE_EXHAUSTED escalates."""
    result = decide_sandbox_outcome(fault, context)
    fault_type = getattr(fault, "fault_type", None)
    if result.decision is SandboxDecision.RETRY:
        assert fault_type in {F.CRASH, F.TIMEOUT}
        assert _matched(fault, context)
        assert result.retry_policy is RetryPolicy.RETRY_LIMITED
    if result.decision is SandboxDecision.ESCALATE:
        assert fault_type is F.RESOURCE_EXHAUSTED
        assert _matched(fault, context)
        assert result.retry_policy is RetryPolicy.HUMAN_DECISION
    if fault_type is F.SECURITY_VIOLATION:
        assert result.decision is SandboxDecision.TERMINATE
    if not _matched(fault, context):
        assert result.decision is SandboxDecision.TERMINATE


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
JSON = st.recursive(
    JSON_LEAF,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "text", "rows"]), children, max_size=3),
    ),
    max_leaves=12,
)


@st.composite
def poisoned_output(draw: st.DrawFn) -> dict[str, object]:
    """A random JSON output with one authority key planted somewhere inside it."""
    key = draw(st.sampled_from(sorted(AUTHORITY_KEYS)))
    planted: object = {key: draw(JSON)}
    for _ in range(draw(st.integers(0, 4))):
        planted = draw(st.sampled_from([[planted], {"a": planted}]))
    return {"data": planted, "other": draw(JSON)}


@PROPERTY
@given(output=poisoned_output(), response_type=st.sampled_from(["SUCCESS", "FAILURE", "BOGUS"]))
def test_invariant_4_an_executor_cannot_claim_authority(
    output: dict[str, object], response_type: str
) -> None:
    """Invariant 4 (Phase-20): an authority key anywhere is denied and is a SECURITY_VIOLATION."""
    instruction = build_executor_instruction(
        instruction_id="I",
        execution_id="E",
        command_type="EXTRACT",
        target_selector="table",
        timestamp="t",
        timeout_ms=10,
    )
    response = {
        "instruction_id": "I",
        "response_type": response_type,
        "evidence_hash": "a" * 64,
        "output": output,
    }
    result = validate_executor_response(instruction, response)
    assert not result.is_safe
    assert outcome_from_response(result).fault_type is F.SECURITY_VIOLATION


@PROPERTY
@given(
    max_attempts=st.integers(1, 8),
    phase=PHASES,
    outcomes=st.lists(
        st.one_of(
            st.sampled_from(ExecutionFaultType).map(AttemptOutcome.fault),
            st.integers(1, 200).map(AttemptOutcome.failure),
            st.just(AttemptOutcome.success()),
        ),
        min_size=20,
        max_size=20,
    ),
)
def test_invariant_5_max_retries_enforced(
    max_attempts: int, phase: AgentPhase | None, outcomes: list[AttemptOutcome]
) -> None:
    """Invariant 5: a loop driven by decide_attempt never runs more than max_attempts attempts."""
    options = RetryOptions(max_attempts=max_attempts)
    attempts = 0
    for attempt, outcome in enumerate(outcomes, start=1):
        attempts = attempt
        decision = decide_attempt(outcome, phase=phase, attempt_number=attempt, options=options)
        if decision.verdict is not Verdict.RETRY:
            break
        assert attempt < max_attempts
    assert attempts <= max_attempts


@PROPERTY
@given(fault=faults(st.sampled_from(ExecutionFaultType)), context=contexts())
def test_invariant_5_engine_never_retries_at_or_beyond_the_budget(
    fault: object, context: object
) -> None:
    """Invariant 5: RETRY only when attempt_number < max_retries."""
    result = decide_sandbox_outcome(fault, context)
    if result.decision is SandboxDecision.RETRY:
        assert isinstance(context, SandboxContext)
        assert context.attempt_number < context.max_retries


@PROPERTY
@given(attempt=st.integers(1, 10_000), max_retries=st.integers(1, 10_000))
def test_resource_exhausted_escalates_at_any_attempt(attempt: int, max_retries: int) -> None:
    """Seed 000 "RESOURCE_EXHAUSTED | Any | Any | ESCALATE": whatever the attempt and budget."""
    context = SandboxContext("EXE-1", "INS-1", attempt, max_retries, 1000, "t")
    fault = FaultReport("F-1", "EXE-1", F.RESOURCE_EXHAUSTED, "oom", "t", attempt)
    assert decide_sandbox_outcome(fault, context).decision is SandboxDecision.ESCALATE
    decision = decide_attempt(
        AttemptOutcome.fault(F.RESOURCE_EXHAUSTED),
        phase=None,
        attempt_number=attempt,
        options=RetryOptions(max_attempts=max_retries),
    )
    assert decision.verdict is Verdict.ESCALATE


@PROPERTY
@given(context=contexts())
def test_enforce_retry_limit_is_attempt_below_budget(context: object) -> None:
    """enforce_retry_limit (and is_retry_allowed) is True exactly when the context is well formed
    and attempt_number < max_retries; retry_limit_overrun exactly when attempt > max_retries."""
    well_formed = context_problem(context) is None
    below = well_formed and context.attempt_number < context.max_retries  # type: ignore[attr-defined]
    over = well_formed and context.attempt_number > context.max_retries  # type: ignore[attr-defined]
    assert enforce_retry_limit(context) is below
    assert is_retry_allowed(context) is below
    assert retry_limit_overrun(context) is over
