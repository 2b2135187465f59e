"""Phase-21 decision engine: the seed-000 section 6 table, deny by default.

Pure functions, no I/O. Inputs are untrusted: every field is checked with ``isinstance`` (type
hints are not trusted, ``bool`` is not accepted where an ``int`` is expected) and anything unknown
or malformed is denied with ``TERMINATE`` and a reason code that says why.

Order of checks in ``decide_sandbox_outcome`` (documented in docs/policy.md):

1. the fault is a ``FaultReport`` with a known ``ExecutionFaultType``;
2. SECURITY_VIOLATION terminates immediately (seed 000: "NO (immediate terminate)") so a breach
   is always reported as a breach, even when the rest of the input is malformed;
3. the context is well formed (ids, attempt >= 1, max_retries >= 1, timeout > 0, timestamp);
4. the fault's other fields are well formed and the fault belongs to this context (same
   execution id, same attempt number);
5. the table. Its "Any" rows (PARTIAL, INVALID_RESPONSE, RESOURCE_EXHAUSTED) hold at any attempt
   number, also beyond the budget: RESOURCE_EXHAUSTED escalates at attempt 4 of 3. The CRASH and
   TIMEOUT rows depend on the attempt: RETRY while ``enforce_retry_limit`` (attempt_number <
   max_retries), TERMINATE at or over the limit; over it (attempt_number > max_retries, an
   attempt that should never have run) the reason code is ``DENY_ATTEMPT_LIMIT_EXCEEDED``.
"""

from __future__ import annotations

from sandbox.policy import reason_codes as rc
from sandbox.policy.context import FaultReport, SandboxContext, SandboxDecisionResult
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

__all__ = [
    "classify_fault",
    "context_problem",
    "decide_sandbox_outcome",
    "enforce_retry_limit",
    "is_retry_allowed",
    "retry_limit_overrun",
]

_POLICY_BY_FAULT: dict[ExecutionFaultType, RetryPolicy] = {
    ExecutionFaultType.CRASH: RetryPolicy.RETRY_LIMITED,
    ExecutionFaultType.TIMEOUT: RetryPolicy.RETRY_LIMITED,
    ExecutionFaultType.PARTIAL: RetryPolicy.NO_RETRY,
    ExecutionFaultType.INVALID_RESPONSE: RetryPolicy.NO_RETRY,
    ExecutionFaultType.RESOURCE_EXHAUSTED: RetryPolicy.HUMAN_DECISION,
    ExecutionFaultType.SECURITY_VIOLATION: RetryPolicy.NO_RETRY,
}

# fault type -> (reason code when retried, reason code when the budget is used up)
_RETRYABLE_CODES: dict[ExecutionFaultType, tuple[str, str]] = {
    ExecutionFaultType.CRASH: (rc.RETRY_AFTER_CRASH, rc.CRASH_RETRY_LIMIT_REACHED),
    ExecutionFaultType.TIMEOUT: (rc.RETRY_AFTER_TIMEOUT, rc.TIMEOUT_RETRY_LIMIT_REACHED),
}


def _is_int(value: object) -> bool:
    """True for a real ``int`` (``bool`` is an int subclass and is rejected)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: object) -> str:
    """A short, safe description of an untrusted value (never calls a foreign ``__repr__``)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return repr(value)[:80]
    return f"a {type(value).__name__}"


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _nonempty_str(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _checked_context(context: object) -> SandboxContext | tuple[str, str]:
    """Return ``context`` when it is well formed, else ``(reason_code, description)``."""
    if not isinstance(context, SandboxContext):
        return rc.DENY_CONTEXT_MALFORMED, f"context is a {type(context).__name__}"
    if not _nonempty_str(context.execution_id):
        return rc.DENY_EXECUTION_ID_INVALID, "execution_id must be a non-empty string"
    if not _nonempty_str(context.instruction_id):
        return rc.DENY_INSTRUCTION_ID_INVALID, "instruction_id must be a non-empty string"
    if not _is_int(context.attempt_number) or context.attempt_number < 1:
        return rc.DENY_ATTEMPT_NUMBER_INVALID, "attempt_number must be an int >= 1"
    if not _is_int(context.max_retries) or context.max_retries < 1:
        return rc.DENY_MAX_RETRIES_INVALID, "max_retries must be an int >= 1"
    if not _is_int(context.timeout_ms) or context.timeout_ms <= 0:
        return rc.DENY_TIMEOUT_INVALID, "timeout_ms must be an int > 0"
    if not _is_str(context.timestamp):
        return rc.DENY_TIMESTAMP_INVALID, "timestamp must be a string"
    return context


def context_problem(context: object) -> tuple[str, str] | None:
    """Return ``(reason_code, description)`` when ``context`` is malformed, else ``None``."""
    checked = _checked_context(context)
    return checked if isinstance(checked, tuple) else None


def classify_fault(fault_type: object, context: object) -> RetryPolicy:
    """Return the retry policy of ``fault_type``; unknown faults or a malformed context: NO_RETRY.

    CRASH/TIMEOUT -> RETRY_LIMITED, RESOURCE_EXHAUSTED -> HUMAN_DECISION, everything else
    (PARTIAL, INVALID_RESPONSE, SECURITY_VIOLATION, anything unknown) -> NO_RETRY. The policy is
    the fault's class; whether the budget allows another attempt is ``is_retry_allowed``.
    """
    if not isinstance(fault_type, ExecutionFaultType) or context_problem(context) is not None:
        return RetryPolicy.NO_RETRY
    return _POLICY_BY_FAULT[fault_type]


def enforce_retry_limit(context: object) -> bool:
    """True only while the context is well formed and ``attempt_number < max_retries``.

    The seed authors' test: within the limit -> True, at or over it -> False (with the seed
    budget of 3: attempts 1 and 2 -> True, 3 and beyond -> False). ``max_retries`` is the attempt
    budget (attempts are numbered from 1), so True means another attempt may follow this one;
    False means the limit is enforced: no further attempt (or the context cannot be trusted).
    """
    checked = _checked_context(context)
    if isinstance(checked, tuple):
        return False
    return checked.attempt_number < checked.max_retries


def is_retry_allowed(context: object) -> bool:
    """True when ``context`` is well formed and ``attempt_number < max_retries``.

    The same predicate as ``enforce_retry_limit`` (seed 000 section 7 names both; the seed
    authors' tests give them the same answers).
    """
    return enforce_retry_limit(context)


def retry_limit_overrun(context: object) -> bool:
    """True when ``context`` is well formed and ``attempt_number > max_retries``.

    Such an attempt should never have run: something bypassed the limit. The attempt-dependent
    rows (CRASH, TIMEOUT) and the non-fault outcomes are denied for it; the "Any" rows are not.
    """
    checked = _checked_context(context)
    if isinstance(checked, tuple):
        return False
    return checked.attempt_number > checked.max_retries


def _terminate(policy: RetryPolicy, code: str, description: str) -> SandboxDecisionResult:
    return SandboxDecisionResult(
        decision=SandboxDecision.TERMINATE,
        retry_policy=policy,
        reason_code=code,
        reason_description=description,
    )


def _fault_problem(fault: FaultReport, context: SandboxContext) -> tuple[str, str] | None:
    for name in ("fault_id", "fault_message", "occurred_at"):
        if not isinstance(getattr(fault, name), str):
            return rc.DENY_FAULT_MALFORMED, f"fault {name} must be a string"
    if not _is_str(fault.execution_id):
        return rc.DENY_FAULT_MALFORMED, "fault execution_id must be a string"
    if not _is_int(fault.attempt_number):
        return rc.DENY_FAULT_MALFORMED, "fault attempt_number must be an int"
    if fault.execution_id != context.execution_id:
        return (
            rc.DENY_EXECUTION_ID_MISMATCH,
            f"fault is for execution {fault.execution_id[:80]!r}, "
            f"context is {context.execution_id[:80]!r}",
        )
    if fault.attempt_number != context.attempt_number:
        return (
            rc.DENY_ATTEMPT_NUMBER_MISMATCH,
            f"fault is for attempt {fault.attempt_number}, context is {context.attempt_number}",
        )
    return None


def decide_sandbox_outcome(fault: object, context: object) -> SandboxDecisionResult:
    """Decide TERMINATE, RETRY or ESCALATE for ``fault`` in ``context`` (never raises)."""
    if not isinstance(fault, FaultReport):
        return _terminate(
            RetryPolicy.NO_RETRY, rc.DENY_FAULT_MALFORMED, f"fault is a {type(fault).__name__}"
        )
    fault_type: object = fault.fault_type
    if not isinstance(fault_type, ExecutionFaultType):
        return _terminate(
            RetryPolicy.NO_RETRY,
            rc.DENY_FAULT_TYPE_UNKNOWN,
            f"unknown fault type {_describe(fault_type)}",
        )
    if fault_type is ExecutionFaultType.SECURITY_VIOLATION:
        return _terminate(
            RetryPolicy.NO_RETRY,
            rc.SECURITY_VIOLATION_TERMINATE,
            "security violation: immediate terminate, never retried",
        )
    checked = _checked_context(context)
    if isinstance(checked, tuple):
        return _terminate(RetryPolicy.NO_RETRY, *checked)
    context = checked
    problem = _fault_problem(fault, context)
    if problem is not None:
        return _terminate(RetryPolicy.NO_RETRY, *problem)
    policy = _POLICY_BY_FAULT[fault_type]
    if fault_type in _RETRYABLE_CODES:
        retry_code, limit_code = _RETRYABLE_CODES[fault_type]
        if enforce_retry_limit(context):
            return SandboxDecisionResult(
                decision=SandboxDecision.RETRY,
                retry_policy=policy,
                reason_code=retry_code,
                reason_description=(
                    f"{fault_type.value} on attempt {context.attempt_number} of "
                    f"{context.max_retries}: retry"
                ),
            )
        if retry_limit_overrun(context):
            return _terminate(
                RetryPolicy.NO_RETRY,
                rc.DENY_ATTEMPT_LIMIT_EXCEEDED,
                f"{fault_type.value} on attempt {context.attempt_number}, which exceeds "
                f"max_retries {context.max_retries}: terminate",
            )
        return _terminate(
            policy,
            limit_code,
            f"{fault_type.value} on the last attempt ({context.max_retries}): terminate",
        )
    if fault_type is ExecutionFaultType.RESOURCE_EXHAUSTED:
        return SandboxDecisionResult(
            decision=SandboxDecision.ESCALATE,
            retry_policy=policy,
            reason_code=rc.RESOURCE_EXHAUSTED_ESCALATE,
            reason_description="resources exhausted: a person decides (retry or terminate)",
        )
    if fault_type is ExecutionFaultType.PARTIAL:
        return _terminate(policy, rc.PARTIAL_NOT_RETRYABLE, "partial output is never a success")
    return _terminate(
        policy, rc.INVALID_RESPONSE_NOT_RETRYABLE, "invalid response: terminate, not retried"
    )
