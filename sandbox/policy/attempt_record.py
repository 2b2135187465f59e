"""The one record of an attempt, for both kinds of turn: what ran, how it ended, what was decided.

Stores keep it, ledgers and `hunter turn show` print it, the attempt loop produces it. Fields a
kind does not have stay ``None``; what only one kind knows (a process's signal, stdout excerpt,
realized writes; an executor's safety reason code) goes in ``extra``, a JSON-ready mapping. So
does the attempt's queue wait (``extra["queued_ms"]``, `AttemptRecord.queued_ms`): it cannot be
derived from the times, since an attempt may wait inside its own ``started_us``..``finished_us``
(the executor hub's queue) and a turn taken over after a restart did not wait for a slot while
no daemon ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from sandbox.policy.attempts import AttemptDecision, AttemptOutcome

__all__ = ["QUEUED_MS", "AttemptRecord"]

_EMPTY: Mapping[str, object] = MappingProxyType({})
#: The ``extra`` key of the attempt's queue wait, in whole milliseconds.
QUEUED_MS = "queued_ms"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt of one turn. ``attempt`` is numbered from 1 within the turn's budget."""

    attempt: int
    started_us: int
    executor_id: str | None = None
    instruction_id: str | None = None
    finished_us: int | None = None
    #: `OutcomeKind` name: SUCCESS, FAILURE, FAULT, REFUSED, NO_EXECUTOR or CIRCUIT_OPEN (None
    #: while running)
    outcome: str | None = None
    #: `ExecutionFaultType` value when the outcome is a fault
    fault_type: str | None = None
    exit_code: int | None = None
    #: `Verdict` name of the decision taken on this attempt
    decision: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    detail: str | None = None
    duration_ms: int | None = None
    #: the backoff before the next attempt, when the decision was RETRY
    delay_ms: int | None = None
    extra: Mapping[str, object] = field(default_factory=lambda: _EMPTY)

    @property
    def finished(self) -> bool:
        """True once the attempt has an outcome and a decision."""
        return self.decision is not None

    @property
    def queued_ms(self) -> int | None:
        """How long the attempt waited before it ran, in milliseconds: for an executor slot (an
        instruction: parked in the turn core, then in the executor hub's queue), for its
        session's lock and a process slot (a process). None when it was not recorded: an
        attempt still waiting in the hub's queue, one restored from a ledger, or one recorded
        before queue waits were."""
        value = self.extra.get(QUEUED_MS)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def with_queued_ms(self, queued_ms: int) -> AttemptRecord:
        """This record with its queue wait recorded (``extra["queued_ms"]``)."""
        return replace(self, extra=MappingProxyType({**self.extra, QUEUED_MS: max(0, queued_ms)}))

    def decided(
        self,
        outcome: AttemptOutcome,
        decision: AttemptDecision,
        *,
        finished_us: int,
        duration_ms: int | None = None,
    ) -> AttemptRecord:
        """This record with its outcome and decision filled in."""
        return replace(
            self,
            finished_us=finished_us,
            outcome=outcome.kind.name,
            fault_type=None if outcome.fault_type is None else outcome.fault_type.value,
            exit_code=outcome.exit_code,
            decision=decision.verdict.name,
            reason_code=decision.reason_code,
            reason=decision.reason,
            detail=self.detail if self.detail else (outcome.message or None),
            duration_ms=(
                duration_ms
                if duration_ms is not None
                else self.duration_ms
                if self.duration_ms is not None
                else max(0, (finished_us - self.started_us) // 1000)
            ),
            delay_ms=decision.delay_ms if decision.verdict.name == "RETRY" else None,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the control API's and the ledgers' shape)."""
        return {
            "attempt": self.attempt,
            "executor_id": self.executor_id,
            "instruction_id": self.instruction_id,
            "started_us": self.started_us,
            "finished_us": self.finished_us,
            "outcome": self.outcome,
            "fault_type": self.fault_type,
            "exit_code": self.exit_code,
            "decision": self.decision,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "detail": self.detail,
            "duration_ms": self.duration_ms,
            "delay_ms": self.delay_ms,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AttemptRecord:
        """Inverse of `to_dict` for stored records (raises `ValueError` on a malformed one)."""

        def text(key: str) -> str | None:
            value = data.get(key)
            if value is not None and not isinstance(value, str):
                msg = f"attempt record: {key} must be a string, got {type(value).__name__}"
                raise ValueError(msg)
            return value

        def number(key: str) -> int | None:
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                msg = f"attempt record: {key} must be an integer, got {type(value).__name__}"
                raise ValueError(msg)
            return value

        attempt, started = number("attempt"), number("started_us")
        if attempt is None or started is None:
            msg = "attempt record: attempt and started_us are required"
            raise ValueError(msg)
        extra = data.get("extra") or {}
        if not isinstance(extra, Mapping):
            msg = "attempt record: extra must be an object"
            raise ValueError(msg)  # noqa: TRY004 (one error type for every malformed stored record)
        return cls(
            attempt=attempt,
            started_us=started,
            executor_id=text("executor_id"),
            instruction_id=text("instruction_id"),
            finished_us=number("finished_us"),
            outcome=text("outcome"),
            fault_type=text("fault_type"),
            exit_code=number("exit_code"),
            decision=text("decision"),
            reason_code=text("reason_code"),
            reason=text("reason"),
            detail=text("detail"),
            duration_ms=number("duration_ms"),
            delay_ms=number("delay_ms"),
            extra=MappingProxyType(dict(extra)),
        )
