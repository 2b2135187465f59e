"""THE attempt loop: run an attempt, decide with `decide_attempt`, back off, record; repeat.

Process turns, instruction turns and `SandboxRetryProtocol` all go through `run_attempts`. Each
kind supplies only "run one attempt" (an `AttemptRunner`); recording (a store, a ledger, a log)
and waiting are injected as `AttemptHooks` and a ``sleep`` function, and time comes from an
injected ``clock``. So this module does no I/O and stays in the pure policy folder.

The loop also resumes a turn: after a crash or a lost lease, the interrupted attempt is passed
as ``interrupted`` and decided as a CRASH fault (`lifecycle.interrupted_outcome`) before any
new attempt runs; a turn that was waiting for a retry passes ``resume_at_us`` to finish its
backoff first.

An optional `RetryGate` (the daemon-wide retry budget, `budget`) hears of every first attempt
and may refuse a RETRY: the attempt is then decided `budget.over_budget` (TERMINATE) instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    RetryOptions,
    Verdict,
    decide_attempt,
)
from sandbox.policy.budget import over_budget
from sandbox.policy.lifecycle import TurnState, final_state, interrupted_outcome

__all__ = [
    "AttemptHooks",
    "AttemptReport",
    "AttemptRunner",
    "LoopEnd",
    "RetryGate",
    "decide_outcome",
    "run_attempts",
]

P = TypeVar("P")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptReport(Generic[P]):
    """What one attempt of either kind produced: its outcome, and the kind's own payload (an
    executor's response, a process's result) which the loop hands back untouched."""

    outcome: AttemptOutcome
    payload: P
    executor_id: str | None = None
    detail: str | None = None
    duration_ms: int | None = None
    extra: MappingProxyType[str, object] = field(default_factory=lambda: MappingProxyType({}))


class AttemptRunner(Protocol[P]):
    """Runs attempt number *attempt* of the turn (numbered from 1) and reports how it ended.

    It must not raise for a failed attempt (that is an outcome); an exception means a bug or a
    broken dependency and ends the loop with that exception.
    """

    def __call__(self, attempt: AttemptRecord) -> Awaitable[AttemptReport[P]]: ...


class AttemptHooks(Protocol):
    """Where the loop's steps become durable and visible (a store, the log). Each hook may
    raise (for example a fenced store refusing a stale claim): the loop stops with it."""

    async def attempt_started(self, attempt: AttemptRecord) -> None:
        """Before the attempt runs."""

    async def retry_scheduled(
        self, attempt: AttemptRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        """After an attempt decided RETRY, before the backoff."""


class RetryGate(Protocol):
    """Shared across turns (the daemon-wide retry budget): told of each turn's first attempt,
    asked before each retry is scheduled."""

    def first_attempt(self) -> None:
        """A turn's first attempt is about to run."""

    def allow_retry(self, decision: AttemptDecision) -> bool:
        """True to schedule the retry *decision*; False ends the turn (`over_budget`)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopEnd(Generic[P]):
    """How the loop ended: the state it leads to (final, or ``escalated``), the last decision
    and outcome, every attempt it decided, and the last report (None when the loop ended on an
    interrupted attempt, which produced none)."""

    state: TurnState
    decision: AttemptDecision
    outcome: AttemptOutcome
    attempts: tuple[AttemptRecord, ...]
    report: AttemptReport[P] | None


def decide_outcome(
    record: AttemptRecord,
    outcome: AttemptOutcome,
    *,
    phase: AgentPhase | None,
    options: RetryOptions,
    execution_id: str,
    instruction_id: str,
    finished_us: int,
    retry_gate: RetryGate | None = None,
) -> tuple[AttemptRecord, AttemptDecision]:
    """One step of the loop: the decision for *outcome* (a RETRY the gate refuses becomes
    `over_budget`) and the attempt's record, decided. `run_attempts` takes this step after each
    attempt; the turn core's record-driven instruction turns (no task per turn) take it when an
    executor's answer arrives."""
    decision = decide_attempt(
        outcome,
        phase=phase,
        attempt_number=record.attempt,
        options=options,
        execution_id=execution_id,
        instruction_id=instruction_id,
    )
    if (
        decision.verdict is Verdict.RETRY
        and retry_gate is not None
        and not retry_gate.allow_retry(decision)
    ):
        decision = over_budget(decision)
    return record.decided(outcome, decision, finished_us=finished_us), decision


async def run_attempts(
    run: AttemptRunner[P],
    *,
    phase: AgentPhase | None,
    options: RetryOptions,
    clock: Callable[[], int],
    sleep: Callable[[float], Awaitable[None]],
    hooks: AttemptHooks,
    first_attempt: int = 1,
    interrupted: AttemptRecord | None = None,
    resume_at_us: int | None = None,
    execution_id: str = "unspecified",
    instruction_id: Callable[[int], str] | None = None,
    should_continue: Callable[[], bool] = lambda: True,
    retry_gate: RetryGate | None = None,
) -> LoopEnd[P] | None:
    """Run attempts from *first_attempt* until a decision other than RETRY; return how it ended.

    ``clock()`` gives integer microseconds since the epoch; ``sleep(seconds)`` waits (and is
    where cancellation reaches the loop between attempts). ``instruction_id(n)`` names attempt
    *n* for the policy and the records. ``should_continue()`` is asked before each new attempt:
    False (the daemon drains) returns None and leaves the turn where it is, to be resumed.
    """
    done: list[AttemptRecord] = []
    name = instruction_id or (lambda n: f"attempt-{n}")
    attempt_number = first_attempt
    pending: tuple[AttemptRecord, AttemptOutcome, AttemptReport[P] | None] | None = None
    if interrupted is not None:
        pending = (interrupted, interrupted_outcome(interrupted.attempt), None)
        attempt_number = interrupted.attempt
    elif resume_at_us is not None:
        wait_s = (resume_at_us - clock()) / 1_000_000
        if wait_s > 0:
            await sleep(wait_s)
    while True:
        if pending is None:
            if not should_continue():
                return None
            record = AttemptRecord(
                attempt=attempt_number, started_us=clock(), instruction_id=name(attempt_number)
            )
            if retry_gate is not None and attempt_number == 1:
                retry_gate.first_attempt()
            await hooks.attempt_started(record)
            report = await run(record)
            record = replace(
                record,
                executor_id=report.executor_id,
                detail=report.detail,
                duration_ms=report.duration_ms,
                extra=report.extra,
            )
            pending = (record, report.outcome, report)
        record, outcome, last = pending
        pending = None
        record, decision = decide_outcome(
            record,
            outcome,
            phase=phase,
            options=options,
            execution_id=execution_id,
            instruction_id=record.instruction_id or name(record.attempt),
            finished_us=clock(),
            retry_gate=retry_gate,
        )
        done.append(record)
        if decision.verdict is Verdict.RETRY:
            next_us = clock() + decision.delay_ms * 1000
            await hooks.retry_scheduled(record, decision, next_us)
            if decision.delay_ms:
                await sleep(decision.delay_ms / 1000)
            attempt_number = record.attempt + 1
            continue
        return LoopEnd(
            state=final_state(outcome, decision),
            decision=decision,
            outcome=outcome,
            attempts=tuple(done),
            report=last,
        )
