"""What a process turn ends with: its `TurnResult`, its `TurnStatus`, and the sandbox edge's
reason codes.

Apart from `process_turn` because everything that ends a turn makes one (the normal ending,
a rejection, an abort, in `process_turn` and `turn_ledger`) and every caller reads one (the
session, the daemon, the CLI): the shape of the answer changes for its readers, not with how
a turn runs. Pure data and one pure mapping (`turn_status`); no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from ledger.pending import PendingLines
from sandbox.enumerate import RealizedWrite
from sandbox.errors import CapabilityViolation
from sandbox.policy.attempts import AttemptDecision, AttemptOutcome, OutcomeKind, Verdict
from sandbox.policy.faults import ExecutionFaultType
from sandbox.promote import PromotedOutput
from sandbox.runs import ProcessAttempt

__all__ = [
    "CAPABILITY_REJECTED",
    "CONFINEMENT_LOST",
    "DECLARATION_INVALID",
    "PROMOTION_FAILED",
    "PROMOTION_IO_FAILED",
    "SANDBOX_UNAVAILABLE",
    "TURN_CANCELLED",
    "TURN_ERROR",
    "TurnResult",
    "TurnStatus",
    "turn_status",
]

TurnStatus = Literal[
    "succeeded",
    "failed",
    "timeout",
    "violation",
    "exhausted",
    "escalated",
    "rejected",
    "terminated",
]

# Reason codes of the sandbox edge (the policy core's codes are in sandbox/policy/reason_codes.py).
DECLARATION_INVALID: Final = "DECLARATION_INVALID"
CAPABILITY_REJECTED: Final = "CAPABILITY_REJECTED"
SANDBOX_UNAVAILABLE: Final = "SANDBOX_UNAVAILABLE"
PROMOTION_FAILED: Final = "PROMOTION_FAILED"
PROMOTION_IO_FAILED: Final = "PROMOTION_IO_FAILED"
#: What a lost sandbox helper (outputs gone before promotion) makes of the attempt: a CRASH.
CONFINEMENT_LOST: Final = "CONFINEMENT_LOST"
TURN_CANCELLED: Final = "TURN_CANCELLED"
TURN_ERROR: Final = "TURN_ERROR"


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The result of one process turn (every field is also in ``to_dict``)."""

    session_id: str
    turn_number: int
    status: TurnStatus
    exit_code: int | None
    fault_type: str | None
    verdict: str
    reason_code: str
    reason: str
    attempts: tuple[ProcessAttempt, ...]
    realized_writes: tuple[RealizedWrite, ...]
    violations: tuple[CapabilityViolation, ...]
    promoted_outputs: tuple[PromotedOutput, ...]
    duration_ms: int
    enforcement: Mapping[str, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    #: the turn's exec and evidence entries when the caller commits them (``ledger_commit=
    #: "caller"``): checked, not yet sealed; the caller's store seals them once the ending's
    #: fence held, in the transaction that commits it
    pending_lines: PendingLines | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``hunter turn --json``)."""
        return {
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "status": self.status,
            "exit_code": self.exit_code,
            "fault_type": self.fault_type,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "attempts": [a.to_dict() for a in self.attempts],
            "realized_writes": [w.to_dict() for w in self.realized_writes],
            "violations": [v.to_dict() for v in self.violations],
            "promoted_outputs": [p.to_dict() for p in self.promoted_outputs],
            "duration_ms": self.duration_ms,
            "enforcement": dict(self.enforcement),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }

    def raise_for_violation(self) -> None:
        """Raise the first ``CapabilityViolation`` of the turn, if there is one (FR-RT-016)."""
        if self.violations:
            raise self.violations[0]


def turn_status(decision: AttemptDecision, outcome: AttemptOutcome, violated: bool) -> TurnStatus:
    """The status of a turn that ran: from the policy's last *decision*, the last attempt's
    *outcome*, and whether any violation was recorded (a violation wins)."""
    if violated:
        return "violation"
    if decision.verdict is Verdict.SUCCEED:
        return "succeeded"
    if decision.verdict is Verdict.EXHAUSTED:
        return "exhausted"
    if decision.verdict is Verdict.ESCALATE:
        return "escalated"
    if outcome.fault_type is ExecutionFaultType.TIMEOUT:
        return "timeout"
    if outcome.kind is OutcomeKind.FAILURE:
        return "failed"
    return "terminated"
