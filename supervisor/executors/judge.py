"""Judging an attempt: what came back (a response, or nothing) mapped to a ``Verdict``.

Pure: no socket I/O, no logging, no state. ``judge_response`` applies the Phase-20 safety rules
(``validate_executor_response``) to the executor's answer and maps the result to an
``AttemptOutcome`` (docs/policy.md, "How the seeds combine", item 4); the other functions
build the verdicts of the cases the hub decides itself, each with its ``HubReason`` code: the
deadline passed, the executor went away, a bad frame or a protocol breach came instead of a
response, a response could not be attributed, no executor was free in time, the hub closed.

Evidence bytes (``docs/protocol.md`` 3.5): a response may carry the evidence itself, base64 in
the message's ``evidence`` field. When the safety rules accept the response, those bytes must be
valid base64 of at most ``MAX_EVIDENCE_BYTES`` whose sha256 is the response's
``evidence_hash``; anything else makes the attempt an INVALID_RESPONSE fault
(``EVIDENCE_INVALID``), and the policy decides what follows. Accepted bytes ride on the verdict
for the turn to store.
"""

from __future__ import annotations

import binascii
import hashlib
from dataclasses import dataclass
from typing import Final

from sandbox.policy.attempts import AttemptOutcome, outcome_from_response
from sandbox.policy.envelopes import ExecutorInstructionEnvelope, ExecutorResponseEnvelope
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import validate_executor_response
from supervisor.executors.reports import HubReason
from supervisor.wire.executor import MAX_EVIDENCE_BYTES

__all__ = [
    "EVIDENCE_INVALID",
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

#: The reason code of a response whose evidence bytes are bad (not base64, too large, or not
#: what ``evidence_hash`` says).
EVIDENCE_INVALID: Final = "EVIDENCE_INVALID"
_MAX_EVIDENCE_B64: Final = 4 * ((MAX_EVIDENCE_BYTES + 2) // 3)
_set: Final = object.__setattr__  # the frozen dataclass's own way to set its fields
_SECURITY_VIOLATION: Final = ExecutionFaultType.SECURITY_VIOLATION  # enum lookups cost a call


@dataclass(frozen=True, slots=True, init=False)
class Verdict:
    """How one attempt ended: its outcome, reason code and detail.

    ``reason_code`` is the Phase-20 reason code when the executor answered, a ``HubReason``
    otherwise; ``response`` is the accepted response envelope (``None`` when denied or absent);
    ``accepted`` says whether the safety rules allowed the answer; ``evidence`` the evidence
    bytes the executor sent with an accepted answer (their sha256 is its ``evidence_hash``).
    """

    outcome: AttemptOutcome
    reason_code: str
    detail: str
    response: ExecutorResponseEnvelope | None
    accepted: bool
    evidence: bytes | None

    def __init__(
        self,
        outcome: AttemptOutcome,
        reason_code: str,
        detail: str,
        response: ExecutorResponseEnvelope | None = None,
        accepted: bool = False,
        *,
        evidence: bytes | None = None,
    ) -> None:
        # One verdict per attempt, on the hot path: the generated frozen __init__ looks up
        # object.__setattr__ again for every field; binding it once saves a quarter of that.
        _set(self, "outcome", outcome)
        _set(self, "reason_code", reason_code)
        _set(self, "detail", detail)
        _set(self, "response", response)
        _set(self, "accepted", accepted)
        _set(self, "evidence", evidence)

    @property
    def breaches_security(self) -> bool:
        """The answer breached security: its executor is quarantined."""
        return self.outcome.fault_type is _SECURITY_VIOLATION


def judge_response(
    envelope: ExecutorInstructionEnvelope, body: object, evidence: object = None
) -> Verdict:
    """The verdict on ``body``, an untrusted answer to ``envelope``, and on the ``evidence``
    field beside it (None: absent) (never raises)."""
    result = validate_executor_response(envelope, body)
    outcome = outcome_from_response(result)
    data: bytes | None = None
    if evidence is not None and result.is_safe and result.response is not None:
        data, problem = _evidence_bytes(evidence, result.response.evidence_hash)
        if problem is not None:
            return _invalid(EVIDENCE_INVALID, problem)
    return Verdict(
        outcome,
        result.reason_code,
        result.reason_description,
        result.response,
        result.is_safe,
        evidence=data,
    )


def _evidence_bytes(evidence: object, evidence_hash: str) -> tuple[bytes | None, str | None]:
    """The evidence bytes, or the problem with them."""
    if not isinstance(evidence, str):
        return None, f"evidence must be a base64 string, got {type(evidence).__name__}"
    if len(evidence) > _MAX_EVIDENCE_B64:
        return None, f"evidence larger than {MAX_EVIDENCE_BYTES} bytes"
    try:
        data = binascii.a2b_base64(evidence, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        return None, f"evidence is not valid base64: {exc}"
    if len(data) > MAX_EVIDENCE_BYTES:
        return None, f"evidence larger than {MAX_EVIDENCE_BYTES} bytes"
    actual = hashlib.sha256(data).hexdigest()
    if actual != evidence_hash:
        claimed = evidence_hash or "no evidence_hash"
        return None, f"evidence sha256 {actual} does not match {claimed}"
    return data, None


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
