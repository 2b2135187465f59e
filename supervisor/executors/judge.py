"""Judging an attempt: what came back (a response, or nothing) mapped to a ``Verdict``.

Pure: no socket I/O, no logging, no state. ``judge_response`` applies the Phase-20 safety rules
(``validate_executor_response``) to the executor's answer and maps the result to an
``AttemptOutcome`` (DESIGN.md "Executor responses"); the other functions build the verdicts of
the cases the hub decides itself, each with its ``HubReason`` code: the deadline passed, the
executor went away, a bad frame or a protocol breach came instead of a response, a response
could not be attributed, no executor was free in time, the hub closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sandbox.policy.attempts import AttemptOutcome, outcome_from_response
from sandbox.policy.envelopes import ExecutorInstructionEnvelope, ExecutorResponseEnvelope
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import validate_executor_response
from supervisor.executors.reports import HubReason

__all__ = [
    "Verdict",
    "bad_frame",
    "deadline_exceeded",
    "disconnected",
    "hub_closed",
    "judge_response",
    "protocol_breach",
    "queue_wait_expired",
    "unattributable",
]

_set: Final = object.__setattr__  # the frozen dataclass's own way to set its fields
_SECURITY_VIOLATION: Final = ExecutionFaultType.SECURITY_VIOLATION  # enum lookups cost a call


@dataclass(frozen=True, slots=True, init=False)
class Verdict:
    """How one attempt ended: its outcome, reason code and detail.

    ``reason_code`` is the Phase-20 reason code when the executor answered, a ``HubReason``
    otherwise; ``response`` is the accepted response envelope (``None`` when denied or absent);
    ``accepted`` says whether the safety rules allowed the answer.
    """

    outcome: AttemptOutcome
    reason_code: str
    detail: str
    response: ExecutorResponseEnvelope | None
    accepted: bool

    def __init__(
        self,
        outcome: AttemptOutcome,
        reason_code: str,
        detail: str,
        response: ExecutorResponseEnvelope | None = None,
        accepted: bool = False,
    ) -> None:
        # One verdict per attempt, on the hot path: the generated frozen __init__ looks up
        # object.__setattr__ again for every field; binding it once saves a quarter of that.
        _set(self, "outcome", outcome)
        _set(self, "reason_code", reason_code)
        _set(self, "detail", detail)
        _set(self, "response", response)
        _set(self, "accepted", accepted)

    @property
    def breaches_security(self) -> bool:
        """The answer breached security: its executor is quarantined."""
        return self.outcome.fault_type is _SECURITY_VIOLATION


def judge_response(envelope: ExecutorInstructionEnvelope, body: object) -> Verdict:
    """The verdict on ``body``, an untrusted answer to ``envelope`` (never raises)."""
    result = validate_executor_response(envelope, body)
    outcome = outcome_from_response(result)
    return Verdict(
        outcome, result.reason_code, result.reason_description, result.response, result.is_safe
    )


def deadline_exceeded(timeout_ms: int) -> Verdict:
    """No answer within the instruction's ``timeout_ms``: TIMEOUT."""
    detail = f"no response within timeout_ms={timeout_ms}"
    return Verdict(
        AttemptOutcome.fault(ExecutionFaultType.TIMEOUT, detail),
        HubReason.DEADLINE_EXCEEDED,
        detail,
    )


def disconnected(executor_id: str, reason_code: str, detail: str) -> Verdict:
    """The executor's connection ended (``reason_code``) with the instruction in flight: CRASH."""
    message = f"executor {executor_id} disconnected mid-instruction: {detail}"
    return Verdict(AttemptOutcome.fault(ExecutionFaultType.CRASH, message), reason_code, message)


def _invalid(reason_code: str, detail: str) -> Verdict:
    return Verdict(
        AttemptOutcome.fault(ExecutionFaultType.INVALID_RESPONSE, detail), reason_code, detail
    )


def bad_frame(reason: str) -> Verdict:
    """An oversized or undecodable frame came instead of a response: INVALID_RESPONSE."""
    return _invalid(HubReason.FRAME_ERROR, f"bad frame instead of a response: {reason}")


def protocol_breach(detail: str) -> Verdict:
    """A well-framed message that breaks the protocol: INVALID_RESPONSE."""
    return _invalid(HubReason.PROTOCOL_ERROR, detail)


def unattributable(instruction_id: object, in_flight: int) -> Verdict:
    """A response naming none of the ``in_flight`` (> 1) instructions: INVALID_RESPONSE."""
    return _invalid(
        HubReason.UNATTRIBUTABLE_RESPONSE,
        f"response names instruction {str(instruction_id)[:128]!r}, which is not one of the "
        f"{in_flight} in flight on this executor",
    )


def queue_wait_expired(detail: str) -> Verdict:
    """No executor had a free slot within ``queue_wait_s``: TIMEOUT."""
    return Verdict(
        AttemptOutcome.fault(ExecutionFaultType.TIMEOUT, detail),
        HubReason.QUEUE_WAIT_EXPIRED,
        detail,
    )


def hub_closed() -> Verdict:
    """The hub closed before the instruction was sent: CRASH."""
    detail = "the executor hub closed before the instruction was sent"
    return Verdict(
        AttemptOutcome.fault(ExecutionFaultType.CRASH, detail), HubReason.HUB_CLOSED, detail
    )
