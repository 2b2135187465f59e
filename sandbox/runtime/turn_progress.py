"""What a running process turn has done so far (`TurnProgress`), and THE attempt loop's hooks
that keep it (`ProcessHooks`).

Apart from `process_turn` because the progress is the one record every ending reads: the
normal ending builds its result from it, and a turn cut short (cancelled, an error, also
during a retry's backoff) is recorded from it by `turn_ledger`. The hooks are the only writer
of its attempts: each attempt the policy decided on is recorded here, with its decision, and
logged (``attempt_finished``, ``retry_scheduled``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import structlog

from sandbox.errors import CapabilityViolation
from sandbox.policy.attempt_record import AttemptRecord as LoopRecord
from sandbox.policy.attempts import AttemptDecision, AttemptOutcome
from sandbox.promote import PromotedOutput
from sandbox.runs import ConfinedRun, ProcessAttempt

__all__ = ["ProcessHooks", "TurnProgress", "with_decision"]

#: the process turn's own logger: these are its events, wherever their code lives
_log = structlog.get_logger("sandbox.runtime.process_turn")


@dataclass(slots=True)
class TurnProgress:
    """What a running turn has done so far, so a turn cut short still records it."""

    request: dict[str, object]
    attempts: list[ProcessAttempt] = field(default_factory=list)
    violations: list[CapabilityViolation] = field(default_factory=list)
    recorded: list[dict[str, object]] = field(default_factory=list)
    promoted: list[PromotedOutput] = field(default_factory=list)


class ProcessHooks:
    """THE attempt loop's hooks for a process turn: a retried attempt is recorded on the turn's
    progress (so a turn cut short during its backoff still records it) and logged.

    ``last`` is the latest confined run (set by the turn's runner); ``finished`` records a run
    with the policy's decision on it, for a retried attempt here and for the last one by the
    turn itself."""

    __slots__ = ("_progress", "_session_id", "_turn", "last")

    def __init__(self, session_id: str, turn: int, progress: TurnProgress) -> None:
        self._session_id = session_id
        self._turn = turn
        self._progress = progress
        self.last: ConfinedRun | None = None

    def finished(self, run: ConfinedRun, decision: AttemptDecision) -> None:
        """Record *run* on the progress with *decision*, and log it."""
        record = with_decision(run.record, run.outcome, decision)
        self._progress.attempts.append(record)
        _log.info(
            "attempt_finished",
            session_id=self._session_id,
            turn_number=self._turn,
            attempt=record.attempt_number,
            exit_code=record.exit_code,
            verdict=record.verdict,
            reason_code=record.reason_code,
            duration_ms=record.duration_ms,
        )

    async def attempt_started(self, attempt: LoopRecord) -> None:
        del attempt

    async def retry_scheduled(
        self, attempt: LoopRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        del next_attempt_us
        assert self.last is not None
        self.finished(self.last, decision)
        _log.info(
            "retry_scheduled",
            session_id=self._session_id,
            turn_number=self._turn,
            attempt=attempt.attempt,
            delay_ms=decision.delay_ms,
        )


def with_decision(
    record: ProcessAttempt, outcome: AttemptOutcome, decision: AttemptDecision
) -> ProcessAttempt:
    """*record* with the policy's *decision* on it (and the fault type *outcome* names)."""
    return replace(
        record,
        verdict=decision.verdict.value,
        reason_code=decision.reason_code,
        reason=decision.reason,
        delay_ms=decision.delay_ms,
        fault_type=(
            outcome.fault_type.value if outcome.fault_type is not None else record.fault_type
        ),
    )
