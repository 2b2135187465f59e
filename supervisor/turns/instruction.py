"""Instruction turns: each attempt is one envelope sent through the executor hub.

The turn's attempts go through the one attempt loop (`sandbox.policy.attempt_loop`); this module
supplies only "run one attempt": build a fresh `ExecutorInstructionEnvelope` (instruction id
``INS-<turn>-<attempt>``, execution id ``EXE-<turn>``), hand it to the hub (which queues it for a
READY executor, enforces the deadline and maps the response to an outcome), and report. A retry
may go to another executor. The turn's ledger entries are written before its ending is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import anyio

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempt_loop import AttemptReport, LoopEnd, run_attempts
from sandbox.policy.attempt_record import QUEUED_MS, AttemptRecord
from sandbox.policy.attempts import AttemptDecision, AttemptOutcome
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorResponseEnvelope,
    deep_thaw,
)
from sandbox.policy.safety import build_executor_instruction, instruction_to_wire
from supervisor.logging import get_logger
from supervisor.store.protocol import TurnEnding, TurnRecord
from supervisor.traces import attempt_traceparent
from supervisor.turns.context import LoopHooks, TurnDeps, end_turn, now_us
from supervisor.turns.requests import iso_now
from supervisor.turns.tracker import ActiveTurn
from supervisor.wire.turn_spec import InstructionSpec

__all__ = [
    "BudgetGate",
    "HubAttemptLike",
    "HubLike",
    "attempt_result",
    "build_envelope",
    "monotonic_ms",
    "run_instruction_turn",
    "slot_wait_s",
]


class HubAttemptLike(Protocol):
    """One attempt as the hub reports it (`supervisor.executors.hub.AttemptReport`)."""

    @property
    def outcome(self) -> AttemptOutcome: ...
    @property
    def executor_id(self) -> str | None: ...
    @property
    def response(self) -> ExecutorResponseEnvelope | None: ...
    @property
    def safety_reason_code(self) -> str: ...
    @property
    def duration_ms(self) -> int: ...
    @property
    def detail(self) -> str: ...
    @property
    def evidence(self) -> bytes | None:
        """The evidence bytes sent with an accepted response (checked against its hash)."""
        ...

    @property
    def queued_ms(self) -> int:
        """The part of ``duration_ms`` the attempt waited for a slot: parked in the core
        (``queued_before_ms``), then in the hub's queue."""
        ...


class HubLike(Protocol):
    """What the turn core needs from the executor hub."""

    def admit(self, command_type: ExecutorCommandType, *, waiting: int = 0) -> None:
        """Raise `QueueFullError` when the command type's queue, with *waiting* more turns
        parked in the core, is full."""

    def free_slots(self, command_type: ExecutorCommandType) -> int:
        """Free slots of READY executors serving the command type, less the attempts already
        waiting in its queue (negative when more wait than there are slots)."""
        ...

    def serving(self, command_type: ExecutorCommandType) -> int:
        """Connected executors that serve the command type (whatever their status)."""
        ...

    @property
    def queue_wait_s(self) -> float:
        """How long an attempt waits in the hub for a slot before it times out."""
        ...

    async def run_attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        *,
        queue_wait_s: float | None = None,
        queued_before_ms: int = 0,
        traceparent: str | None = None,
    ) -> HubAttemptLike:
        """One attempt; *queue_wait_s* bounds its wait for a slot (None: the hub's own);
        *queued_before_ms*: how long it already waited for one (parked in the core): the
        report's ``queued_ms`` (and ``duration_ms``) include it."""
        ...


def slot_wait_s(hub: HubLike, spec: InstructionSpec | None) -> float:
    """How long an attempt of *spec* may wait for an executor slot (parked, then in the hub):
    the hub's queue wait, never longer than the instruction's own ``timeout_ms``."""
    if spec is None:
        return hub.queue_wait_s
    return min(hub.queue_wait_s, spec.timeout_ms / 1000)


def monotonic_ms() -> int:
    """The clock of the retry budget (and of the circuit breakers)."""
    return time.monotonic_ns() // 1_000_000


class BudgetGate:
    """The daemon-wide retry budget (`sandbox.policy.budget`) as the attempt loop's
    `RetryGate` for one turn: the budget's counts are shared by every instruction turn, its
    limits are the settings in force (a reload applies at once)."""

    __slots__ = ("_deps", "_log_ids")

    def __init__(self, deps: TurnDeps, **log_ids: object) -> None:
        self._deps = deps
        self._log_ids = log_ids

    def first_attempt(self) -> None:
        deps = self._deps
        deps.retry_budget.first_attempt(monotonic_ms(), deps.settings.retry_budget)

    def allow_retry(self, decision: AttemptDecision) -> bool:
        deps = self._deps
        limits = deps.settings.retry_budget
        if deps.retry_budget.try_retry(monotonic_ms(), limits):
            return True
        stats = deps.retry_budget.statistics(monotonic_ms(), limits)
        get_logger("supervisor.turns").warning(
            "retry_refused",
            reason_code=rc.DAEMON_RETRY_BUDGET_EXHAUSTED,
            would_be=decision.reason_code,
            retries=stats.retries,
            first_attempts=stats.first_attempts,
            allowance=stats.allowance,
            window_ms=limits.window_ms,
            **self._log_ids,
        )
        return False


@dataclass(frozen=True, slots=True)
class _Sent:
    envelope: Mapping[str, object]
    report: HubAttemptLike


def _result(
    sent: _Sent | None, fallback_detail: str | None, evidence: Mapping[str, object] | None = None
) -> dict[str, object]:
    if sent is None:
        return {"detail": fallback_detail}
    return attempt_result(sent.envelope, sent.report, fallback_detail, evidence)


def attempt_result(
    wire: Mapping[str, object],
    report: HubAttemptLike,
    fallback_detail: str | None,
    evidence: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """A turn's ``result``: the last attempt's report, the executor's answer, the evidence
    stored for it, and the instruction sent (*wire*, the envelope as it went out)."""
    result: dict[str, object] = {
        "executor_id": report.executor_id,
        "safety_reason_code": report.safety_reason_code,
        "detail": report.detail,
    }
    response = report.response
    if response is not None:
        result.update(
            response_type=response.response_type.value,
            evidence_hash=response.evidence_hash,
            error_message=response.error_message,
            output=deep_thaw(response.output or {}),
            partial=bool(response.partial),
        )
    if evidence is not None:  # the executor's evidence bytes, stored under the session
        result["evidence"] = dict(evidence)
    result["last_instruction"] = dict(wire)
    return result


async def run_instruction_turn(
    deps: TurnDeps,
    hub: HubLike,
    turn: TurnRecord,
    active: ActiveTurn,
    spec: InstructionSpec,
    *,
    interrupted: AttemptRecord | None,
    dispatched: Callable[[], None] = lambda: None,
    queue_waited_s: float = 0.0,
) -> TurnRecord | None:
    """Run the turn's attempts to its ending (final or escalated); None when a drain stopped
    it before an attempt (it stays accepted / waiting_retry for the restart). *dispatched* is
    called just before an envelope goes to the hub (the core's launch count). *queue_waited_s*:
    how long the turn already waited parked for a slot; its first attempt waits the rest of its
    bound (`slot_wait_s`), not all of it again. Each attempt records its queue wait
    (``queued_ms``: that part, then the hub's queue) and how long it ran apart from it."""
    execution_id = f"EXE-{turn.turn_id}"
    hooks = LoopHooks(deps, active, overlap_start=True, command_type=spec.command_type.value)
    hooks.queued_ms = int(queue_waited_s * 1000)  # logged with the first attempt's start

    async def one_attempt(attempt: AttemptRecord) -> AttemptReport[_Sent]:
        envelope = build_envelope(spec, attempt, execution_id)
        dispatched()
        nonlocal queue_waited_s
        parked_s = queue_waited_s
        wait = max(0.0, slot_wait_s(hub, spec) - parked_s)
        queue_waited_s = 0.0  # a retry waits its full bound again
        traceparent = attempt_traceparent(turn, attempt) if deps.traced else None
        report = await _start_and_send(
            hooks,
            hub,
            envelope,
            wait,
            queued_before_ms=int(parked_s * 1000),
            traceparent=traceparent,
        )
        active.executor_id = report.executor_id
        # The attempt's queue wait: parked in the core (a parked turn's first attempt here),
        # then in the hub's queue; the hub reports the whole of it (and logs the same figure).
        queued_ms = report.queued_ms
        deps.tracker.attempt_queued(spec.command_type.value, queued_ms)
        detail = ": ".join(p for p in (report.safety_reason_code, report.detail) if p)
        return AttemptReport(
            outcome=report.outcome,
            payload=_Sent(instruction_to_wire(envelope), report),
            executor_id=report.executor_id,
            detail=detail or None,
            duration_ms=max(0, report.duration_ms - report.queued_ms),  # how long it ran
            extra=MappingProxyType({QUEUED_MS: queued_ms}),
        )

    try:
        end = await run_attempts(
            one_attempt,
            phase=spec.phase,
            options=deps.settings.retry,
            clock=now_us,
            sleep=anyio.sleep,
            hooks=hooks,
            first_attempt=turn.attempt + 1,
            interrupted=interrupted,
            resume_at_us=turn.next_attempt_us if interrupted is None else None,
            execution_id=execution_id,
            instruction_id=lambda n: f"INS-{turn.turn_id}-{n}",
            should_continue=lambda: not deps.draining,
            retry_gate=BudgetGate(deps, command_type=spec.command_type.value),
        )
        if end is None:
            return None
        return await _end(deps, hooks, turn, active, end)
    finally:
        hooks.stop_counting()


async def _start_and_send(
    hooks: LoopHooks,
    hub: HubLike,
    envelope: ExecutorInstructionEnvelope,
    queue_wait_s: float | None,
    *,
    queued_before_ms: int,
    traceparent: str | None,
) -> HubAttemptLike:
    """Send the envelope while the attempt's queued start commits: the start is durable before
    the attempt's outcome is recorded (the store commits in order), with no sync between
    dispatch and the reply. A crash in between re-runs the attempt under the same number."""
    try:
        report = await hub.run_attempt(
            envelope,
            queue_wait_s=queue_wait_s,
            queued_before_ms=queued_before_ms,
            traceparent=traceparent,
        )
    except Exception:
        await hooks.commit_start()  # a refused start (stale claim) is the error that counts
        raise
    except BaseException:  # cancelled: the start is never written
        hooks.forget_start()
        raise
    await hooks.commit_start()
    return report


def build_envelope(
    spec: InstructionSpec, attempt: AttemptRecord, execution_id: str
) -> ExecutorInstructionEnvelope:
    """The envelope of *attempt* (built once per attempt; the Phase-20 rules apply)."""
    return build_executor_instruction(
        instruction_id=attempt.instruction_id or f"INS-{execution_id}-{attempt.attempt}",
        execution_id=execution_id,
        command_type=spec.command_type,
        target_url=spec.target_url,
        target_selector=spec.target_selector,
        timestamp=iso_now(),
        timeout_ms=spec.timeout_ms,
        parameters=spec.parameters,
    )


async def _end(
    deps: TurnDeps, hooks: LoopHooks, turn: TurnRecord, active: ActiveTurn, end: LoopEnd[_Sent]
) -> TurnRecord:
    last = end.attempts[-1]
    hooks.log_fault(last)
    sent = end.report.payload if end.report else None
    evidence = None
    if sent is not None and sent.report.evidence is not None:
        evidence = await deps.sessions.store_evidence(turn.session_id, sent.report.evidence)
    ending = TurnEnding(
        state=end.state,
        verdict=end.decision.verdict.name,
        reason_code=end.decision.reason_code,
        reason=end.decision.reason,
        fault_type=None if end.outcome.fault_type is None else end.outcome.fault_type.value,
        result=_result(sent, last.detail, evidence),
    )
    finished = await end_turn(
        deps, turn, active, ending, [last], started=hooks.take_unwritten_start()
    )
    hooks.stop_counting()
    return finished
