"""THE attempt mapping of docs/policy.md "How the seeds combine" (seeds 000, 002, 003).

One pure function, ``decide_attempt``, turns (outcome of an attempt, agent phase, attempt number,
retry options) into a verdict with a stable reason code. The retry protocol, the process-turn
runner and the daemon all call it, so there is exactly one place where retry decisions are made;
fault decisions are delegated to Phase-21's ``decide_sandbox_outcome`` (one decision table).

The combination, in order:

* deny by default: an outcome, phase or options object that is not what it claims to be is
  TERMINATE with a ``DENY_*`` code; the attempt context is checked by the Phase-21 engine;
* SUCCESS -> SUCCEED; REFUSED -> TERMINATE, never retried; NO_EXECUTOR (no connected executor
  serves the command type) -> TERMINATE ``NO_CAPABLE_EXECUTOR``, never retried; CIRCUIT_OPEN
  (the pool's circuit breaker is open, `breaker`) -> TERMINATE ``CIRCUIT_OPEN``, never retried;
* a FAILURE whose exit code is transient (seed 003: 124-128, or a signal) is the Phase-21 fault
  it stands for (124 TIMEOUT, 125-128 CRASH) and goes through the fault path;
* FAULT -> ``decide_sandbox_outcome``; its RETRY is then gated by the phase: automatic retry only
  in GREEN and VERIFY (or with no phase, where Phase-21 alone decides); in RED/REFACTOR the turn
  ends with TERMINATE ``PHASE_NOT_RETRYABLE``;
* a SUCCESS, REFUSED or persistent FAILURE on an attempt beyond the budget (``attempt_number >
  max_attempts``: it should never have run) is TERMINATE ``DENY_ATTEMPT_LIMIT_EXCEEDED``; a fault
  there is decided by the table (RESOURCE_EXHAUSTED still escalates, seed 000 "Any");
* a persistent FAILURE is retried in GREEN/VERIFY while ``enforce_retry_limit`` holds
  (``attempt_number < max_attempts``); on the last attempt the verdict is EXHAUSTED with
  ``record_entropy=True``; in RED/REFACTOR it is TERMINATE ``PHASE_NOT_RETRYABLE``; with no
  phase Phase-21 has no rule for it, so it is TERMINATE ``FAILURE_NOT_RETRIED``.

A RETRY waits ``RetryOptions.delay_ms`` (the backoff), or, when the outcome carries the
executor's ``retry_after_ms``, that many milliseconds instead, capped at ``max_delay_ms``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, unique
from typing import Final, cast

from sandbox.policy import reason_codes as rc
from sandbox.policy.classifier import ErrorClass, ErrorClassifier
from sandbox.policy.context import FaultReport, SandboxContext
from sandbox.policy.engine import (
    context_problem,
    decide_sandbox_outcome,
    enforce_retry_limit,
    retry_limit_overrun,
)
from sandbox.policy.envelopes import ExecutionSafetyResult, ExecutorResponseType
from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

__all__ = [
    "RETRYABLE_PHASES",
    "AgentPhase",
    "AttemptDecision",
    "AttemptOutcome",
    "OutcomeKind",
    "RetryOptions",
    "Verdict",
    "decide_attempt",
    "outcome_from_response",
    "retry_delay_ms",
]

_UNSPECIFIED_ID: Final = "unspecified"
# The engine only checks that the timeout is positive; deadlines are enforced by the runner.
_POLICY_TIMEOUT_MS: Final = 1
_MAX_BACKOFF_STEPS: Final = 10_000


def _describe(value: object) -> str:
    """A short, safe description of an untrusted value (never calls a foreign ``__repr__``)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return repr(value)[:80]
    return f"a {type(value).__name__}"


def _is_int(value: object) -> bool:
    """True for a real ``int`` (``bool`` is rejected); hints of untrusted input are not trusted."""
    return isinstance(value, int) and not isinstance(value, bool)


@unique
class AgentPhase(Enum):
    """The agent's TDD phase (seed 003). Automatic retry only in GREEN and VERIFY."""

    RED = "RED"
    GREEN = "GREEN"
    VERIFY = "VERIFY"
    REFACTOR = "REFACTOR"


#: Phases in which failed attempts are retried automatically.
RETRYABLE_PHASES: Final[frozenset[AgentPhase]] = frozenset({AgentPhase.GREEN, AgentPhase.VERIFY})


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryOptions:
    """Attempt budget and backoff: 500 ms x 2 per attempt, capped, optional +/- jitter.

    Raises ``ValueError`` on construction for a budget below 1, a negative delay, a multiplier
    below 1 or a jitter fraction outside 0..1 (configuration errors fail loudly).
    """

    max_attempts: int = 3
    base_delay_ms: int = 500
    backoff_multiplier: float = 2
    max_delay_ms: int = 30_000
    jitter: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_attempts", "base_delay_ms", "max_delay_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                msg = f"{name} must be an int, got {value!r}"
                raise TypeError(msg)
        if self.max_attempts < 1:
            msg = f"max_attempts must be >= 1, got {self.max_attempts}"
            raise ValueError(msg)
        if self.base_delay_ms < 0 or self.max_delay_ms < 0:
            msg = "base_delay_ms and max_delay_ms must be >= 0"
            raise ValueError(msg)
        if not self.backoff_multiplier >= 1:
            msg = f"backoff_multiplier must be >= 1, got {self.backoff_multiplier}"
            raise ValueError(msg)
        if not 0.0 <= self.jitter <= 1.0:
            msg = f"jitter must be a fraction in 0..1, got {self.jitter}"
            raise ValueError(msg)

    def delay_ms(self, attempt_number: int, *, rand: Callable[[], float] | None = None) -> int:
        """Delay before attempt ``attempt_number + 1``: base x multiplier^(n-1), capped.

        With the defaults: after attempt 1 -> 500, after attempt 2 -> 1000. With ``jitter`` j the
        delay is scaled by a factor in [1 - j, 1 + j) drawn from ``rand`` (default
        ``random.random``), then capped again at ``max_delay_ms``.
        """
        if not _is_int(attempt_number) or attempt_number < 1:
            msg = f"attempt_number must be an int >= 1, got {attempt_number!r}"
            raise ValueError(msg)
        delay = float(min(self.base_delay_ms, self.max_delay_ms))
        if self.backoff_multiplier > 1 and delay > 0:
            for _ in range(min(attempt_number - 1, _MAX_BACKOFF_STEPS)):
                delay *= self.backoff_multiplier
                if delay >= self.max_delay_ms:
                    delay = float(self.max_delay_ms)
                    break
        if self.jitter > 0:
            draw = (rand or random.random)()
            delay *= 1 - self.jitter + 2 * self.jitter * draw
        return max(0, min(round(delay), self.max_delay_ms))


@unique
class OutcomeKind(Enum):
    """How an attempt ended."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    FAULT = "FAULT"
    REFUSED = "REFUSED"
    #: no connected executor serves the command type (the attempt never reached one)
    NO_EXECUTOR = "NO_EXECUTOR"
    #: the command type's circuit breaker is open (the attempt failed fast, `breaker`)
    CIRCUIT_OPEN = "CIRCUIT_OPEN"


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """The outcome of one attempt (not validated here: ``decide_attempt`` denies bad ones).

    ``retry_after_ms``: the executor's own say on how long to wait before a retry (a FAILURE or
    ERROR response's ``retry_after_ms``); a RETRY decision waits that long instead of the
    computed backoff, capped at ``RetryOptions.max_delay_ms`` (Temporal's ``next_retry_delay``).
    """

    kind: OutcomeKind
    exit_code: int | None = None
    fault_type: ExecutionFaultType | None = None
    message: str = ""
    retry_after_ms: int | None = None

    @classmethod
    def success(cls) -> AttemptOutcome:
        """The attempt succeeded (exit 0, or an accepted SUCCESS response)."""
        return cls(OutcomeKind.SUCCESS, exit_code=0)

    @classmethod
    def failure(cls, exit_code: int | None, message: str = "") -> AttemptOutcome:
        """The tool ran and failed (non-zero exit, or a FAILURE response with no exit code)."""
        return cls(OutcomeKind.FAILURE, exit_code=exit_code, message=message)

    @classmethod
    def fault(cls, fault_type: ExecutionFaultType, message: str = "") -> AttemptOutcome:
        """The attempt hit a Phase-21 fault."""
        return cls(OutcomeKind.FAULT, fault_type=fault_type, message=message)

    @classmethod
    def refused(cls, message: str = "") -> AttemptOutcome:
        """The executor refused the instruction."""
        return cls(OutcomeKind.REFUSED, message=message)

    @classmethod
    def no_executor(cls, message: str = "") -> AttemptOutcome:
        """No connected executor serves the command type: the attempt reached none."""
        return cls(OutcomeKind.NO_EXECUTOR, message=message)

    @classmethod
    def circuit_open(cls, message: str = "") -> AttemptOutcome:
        """The command type's circuit breaker is open: the attempt failed fast."""
        return cls(OutcomeKind.CIRCUIT_OPEN, message=message)

    @classmethod
    def from_exit_code(
        cls,
        exit_code: int | None,
        *,
        killed_by_signal: int | None = None,
        timed_out: bool = False,
        resource_exhausted: bool = False,
        security_violation: bool = False,
    ) -> AttemptOutcome:
        """Map a finished process to an outcome (docs/policy.md, "How the seeds combine", item 3).

        Precedence, most severe first: breach -> SECURITY_VIOLATION; limit hit ->
        RESOURCE_EXHAUSTED; deadline or exit 124 -> TIMEOUT; signal, no exit code, a negative
        code or exit 125-128 -> CRASH; exit 0 -> SUCCESS; any other code -> FAILURE.
        """
        code = f"exit code {exit_code}"
        if security_violation:
            return cls(OutcomeKind.FAULT, exit_code, ExecutionFaultType.SECURITY_VIOLATION, code)
        if resource_exhausted:
            return cls(OutcomeKind.FAULT, exit_code, ExecutionFaultType.RESOURCE_EXHAUSTED, code)
        if timed_out:
            return cls(OutcomeKind.FAULT, exit_code, ExecutionFaultType.TIMEOUT, "deadline passed")
        if killed_by_signal is not None:
            return cls(
                OutcomeKind.FAULT,
                exit_code,
                ExecutionFaultType.CRASH,
                f"killed by signal {killed_by_signal}",
            )
        if exit_code is None:
            return cls(OutcomeKind.FAULT, None, ExecutionFaultType.CRASH, "no exit status")
        if exit_code == 0:
            return cls.success()
        fault_type = ErrorClassifier.fault_type(exit_code)
        if fault_type is not None:
            return cls(OutcomeKind.FAULT, exit_code, fault_type, code)
        return cls.failure(exit_code, code)


@unique
class Verdict(Enum):
    """What the caller does next."""

    SUCCEED = "SUCCEED"
    RETRY = "RETRY"
    TERMINATE = "TERMINATE"
    ESCALATE = "ESCALATE"
    EXHAUSTED = "EXHAUSTED"


@dataclass(frozen=True, slots=True)
class AttemptDecision:
    """The verdict for one attempt, with the Phase-21 decision it was derived from (if any).

    ``sandbox_decision``/``retry_policy`` are the engine's answer for a fault (``None`` when the
    engine was not consulted); when the phase gate overrides an engine RETRY they still show
    RETRY/RETRY_LIMITED while ``verdict`` is TERMINATE and ``reason_code`` PHASE_NOT_RETRYABLE.
    """

    verdict: Verdict
    reason_code: str
    reason: str
    delay_ms: int = 0
    fault_type: ExecutionFaultType | None = None
    sandbox_decision: SandboxDecision | None = None
    retry_policy: RetryPolicy | None = None
    record_entropy: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for logs and ledgers (enum values as strings)."""
        return {
            "verdict": self.verdict.value,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "delay_ms": self.delay_ms,
            "fault_type": None if self.fault_type is None else self.fault_type.value,
            "sandbox_decision": (
                None if self.sandbox_decision is None else self.sandbox_decision.value
            ),
            "retry_policy": None if self.retry_policy is None else self.retry_policy.value,
            "record_entropy": self.record_entropy,
        }


def _deny(code: str, reason: str, fault_type: ExecutionFaultType | None = None) -> AttemptDecision:
    return AttemptDecision(
        Verdict.TERMINATE,
        code,
        reason,
        fault_type=fault_type,
        sandbox_decision=SandboxDecision.TERMINATE,
        retry_policy=RetryPolicy.NO_RETRY,
    )


def retry_delay_ms(options: RetryOptions, attempt_number: int, retry_after_ms: object) -> int:
    """The wait before the attempt after *attempt_number*: the executor's *retry_after_ms* when
    it is a non-negative int (capped at ``max_delay_ms``), else the backoff schedule."""
    if _is_int(retry_after_ms) and cast("int", retry_after_ms) >= 0:
        return min(cast("int", retry_after_ms), options.max_delay_ms)
    return options.delay_ms(attempt_number)


def _phase_name(phase: AgentPhase | None) -> str:
    return "no phase" if phase is None else f"phase {phase.value}"


def _decide_fault(
    fault_type: object,
    message: str,
    *,
    context: SandboxContext,
    phase: AgentPhase | None,
    options: RetryOptions,
    retry_after_ms: object = None,
) -> AttemptDecision:
    fault = FaultReport(
        fault_id=f"{context.instruction_id}#{context.attempt_number}",
        execution_id=context.execution_id,
        fault_type=cast("ExecutionFaultType", fault_type),
        fault_message=message,
        occurred_at=context.timestamp,
        attempt_number=context.attempt_number,
    )
    result = decide_sandbox_outcome(fault, context)
    known = fault_type if isinstance(fault_type, ExecutionFaultType) else None
    if result.decision is SandboxDecision.RETRY:
        label = "fault" if known is None else known.value
        if phase is not None and phase not in RETRYABLE_PHASES:
            return AttemptDecision(
                Verdict.TERMINATE,
                rc.PHASE_NOT_RETRYABLE,
                f"{label} is retryable but {_phase_name(phase)} is not "
                "(automatic retry only in GREEN and VERIFY)",
                fault_type=known,
                sandbox_decision=result.decision,
                retry_policy=result.retry_policy,
            )
        return AttemptDecision(
            Verdict.RETRY,
            result.reason_code,
            result.reason_description,
            delay_ms=retry_delay_ms(options, context.attempt_number, retry_after_ms),
            fault_type=known,
            sandbox_decision=result.decision,
            retry_policy=result.retry_policy,
        )
    verdict = Verdict.ESCALATE if result.decision is SandboxDecision.ESCALATE else Verdict.TERMINATE
    return AttemptDecision(
        verdict,
        result.reason_code,
        result.reason_description,
        fault_type=known,
        sandbox_decision=result.decision,
        retry_policy=result.retry_policy,
    )


def decide_attempt(
    outcome: object,
    *,
    phase: object,
    attempt_number: object,
    options: object,
    execution_id: object = "",
    instruction_id: object = "",
) -> AttemptDecision:
    """Decide what follows an attempt (never raises; see the module docstring for the rules).

    ``attempt_number`` counts from 1; ``options.max_attempts`` is Phase-21's ``max_retries``.
    Empty ``execution_id``/``instruction_id`` are replaced by a placeholder for the engine.
    """
    if not isinstance(outcome, AttemptOutcome) or not isinstance(outcome.kind, OutcomeKind):
        return _deny(rc.DENY_OUTCOME_MALFORMED, f"outcome is {_describe(outcome)}")
    if not isinstance(options, RetryOptions):
        return _deny(rc.DENY_OPTIONS_INVALID, f"options is a {type(options).__name__}")
    if phase is not None and not isinstance(phase, AgentPhase):
        return _deny(rc.DENY_PHASE_UNKNOWN, f"unknown phase {_describe(phase)}")
    context = SandboxContext(
        execution_id=cast("str", _UNSPECIFIED_ID if execution_id == "" else execution_id),
        instruction_id=cast("str", _UNSPECIFIED_ID if instruction_id == "" else instruction_id),
        attempt_number=cast("int", attempt_number),
        max_retries=options.max_attempts,
        timeout_ms=_POLICY_TIMEOUT_MS,
        timestamp="",
    )
    kind = outcome.kind
    if kind is OutcomeKind.FAILURE:
        exit_code = outcome.exit_code
        if exit_code is not None and (not _is_int(exit_code) or exit_code == 0):
            return _deny(
                rc.DENY_OUTCOME_MALFORMED, f"failure with exit code {_describe(exit_code)}"
            )
        if exit_code is not None and ErrorClassifier.classify(exit_code) is ErrorClass.TRANSIENT:
            transient = ErrorClassifier.fault_type(exit_code)
            message = outcome.message or f"transient exit code {exit_code}"
            return _decide_fault(transient, message, context=context, phase=phase, options=options)
    if kind is OutcomeKind.FAULT:
        return _decide_fault(
            outcome.fault_type,
            str(outcome.message),
            context=context,
            phase=phase,
            options=options,
            retry_after_ms=outcome.retry_after_ms,
        )
    problem = context_problem(context)
    if problem is not None:
        return _deny(*problem)
    if retry_limit_overrun(context):
        return _deny(
            rc.DENY_ATTEMPT_LIMIT_EXCEEDED,
            f"attempt {attempt_number} exceeds max_attempts {options.max_attempts}",
        )
    if kind is OutcomeKind.SUCCESS:
        return AttemptDecision(Verdict.SUCCEED, rc.ATTEMPT_SUCCEEDED, "attempt succeeded")
    if kind is OutcomeKind.REFUSED:
        return _deny(rc.EXECUTOR_REFUSED, "executor refused the instruction: not retried")
    if kind is OutcomeKind.NO_EXECUTOR:
        return _deny(
            rc.NO_CAPABLE_EXECUTOR,
            "no connected executor serves the command type: not retried (a retry would wait "
            "for one the same way)",
        )
    if kind is OutcomeKind.CIRCUIT_OPEN:
        return _deny(
            rc.CIRCUIT_OPEN,
            "the executor pool of this command type keeps failing (its circuit breaker is "
            "open): failed fast, not retried",
        )
    # A persistent failure (seed 003's PersistentError).
    failed = f"failed with exit code {outcome.exit_code}"
    if phase is None:
        return AttemptDecision(
            Verdict.TERMINATE,
            rc.FAILURE_NOT_RETRIED,
            f"{failed}; no phase, Phase-21 retries faults only",
            retry_policy=RetryPolicy.NO_RETRY,
        )
    if phase not in RETRYABLE_PHASES:
        return AttemptDecision(
            Verdict.TERMINATE,
            rc.PHASE_NOT_RETRYABLE,
            f"{failed}; {_phase_name(phase)} is not retried automatically",
            retry_policy=RetryPolicy.NO_RETRY,
        )
    if enforce_retry_limit(context):
        return AttemptDecision(
            Verdict.RETRY,
            rc.PERSISTENT_FAILURE_RETRY,
            f"{failed} on attempt {attempt_number} of {options.max_attempts}: retry",
            delay_ms=retry_delay_ms(options, context.attempt_number, outcome.retry_after_ms),
            retry_policy=RetryPolicy.RETRY_LIMITED,
        )
    return AttemptDecision(
        Verdict.EXHAUSTED,
        rc.RETRY_BUDGET_EXHAUSTED,
        f"{failed} on the last of {options.max_attempts} attempts",
        retry_policy=RetryPolicy.RETRY_LIMITED,
        record_entropy=True,
    )


def outcome_from_response(result: ExecutionSafetyResult) -> AttemptOutcome:
    """Map a validated executor response to an outcome (docs/policy.md, "How the seeds
    combine", item 4).

    Denied: an authority claim -> SECURITY_VIOLATION, anything else -> INVALID_RESPONSE.
    Allowed: SUCCESS -> success (PARTIAL fault when ``partial``), FAILURE -> failure without an
    exit code, TIMEOUT -> TIMEOUT, ERROR -> CRASH, REFUSED -> refused. A FAILURE's or ERROR's
    ``retry_after_ms`` rides on the outcome (the wait before a retry); other types' is ignored.
    """
    response = result.response
    if not result.is_safe or response is None:
        fault_type = (
            ExecutionFaultType.SECURITY_VIOLATION
            if result.reason_code == rc.RESPONSE_CLAIMS_AUTHORITY
            else ExecutionFaultType.INVALID_RESPONSE
        )
        return AttemptOutcome.fault(
            fault_type, f"{result.reason_code}: {result.reason_description}"
        )
    message = response.error_message
    kind = response.response_type
    if kind is ExecutorResponseType.SUCCESS:
        if response.partial:
            return AttemptOutcome.fault(ExecutionFaultType.PARTIAL, "partial output")
        return AttemptOutcome.success()
    if kind is ExecutorResponseType.FAILURE:
        return AttemptOutcome(
            OutcomeKind.FAILURE, message=message, retry_after_ms=response.retry_after_ms
        )
    if kind is ExecutorResponseType.TIMEOUT:
        return AttemptOutcome.fault(ExecutionFaultType.TIMEOUT, message)
    if kind is ExecutorResponseType.ERROR:
        return AttemptOutcome(
            OutcomeKind.FAULT,
            fault_type=ExecutionFaultType.CRASH,
            message=message,
            retry_after_ms=response.retry_after_ms,
        )
    return AttemptOutcome.refused(message)
