"""Instruction turns as records: an attempt in flight is a `Flight`, not a task.

The hot path of an instruction turn (its first attempt, or the attempt of a turn taken off the
parked queue, going straight to an executor with a free slot) runs without a task, a cancel
scope or an event of its own:

1. `InstructionFlights.launch` builds the envelope once (and its wire form once), notes the
   attempt's start (`starts.DeferredStarts`: written only if the attempt outlives a short
   delay) and hands the envelope to the hub (`DispatchingHub.dispatch`), which writes it to the
   executor's connection and keeps its deadline in the connection's timer heap.
2. The executor's answer reaches `_answered` from the connection's reader: the outcome is
   decided by the pure attempt policy (`attempt_loop.decide_outcome`, the same step the attempt
   loop takes).
3. An ending (success, a terminal fault, an escalation) is queued there too
   (`TurnStore.finish_soon`) with its exec and evidence entries, checked but not sealed: the
   store seals them once the ending's fence held, in the transaction that commits it, so a
   refused ending never takes a seq. The endings queued in one pass of the event loop commit in
   one transaction. When the store is done with it, its callback (`PendingWrite.when_done`)
   lets the lines into the files, and the tracker and the waiters hear of it. Only an answer
   with evidence bytes goes through a task (`run`), which writes them to the session first.

4. A RETRY is recorded the same way (`TurnStore.record_attempt_soon`), its backoff waits on one
   timer heap (`supervisor.timers.Timers`), and the next attempt is launched as in 1.

What is rare keeps the per-turn task of `runner.TurnRunner`, where it is simplest to get right
(`FlightOwner`): ending a cancelled turn, an attempt that cannot go straight to a slot (the
hub's queue, an open circuit), a recovered turn, and an error while ending.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import anyio

from ledger.entries import SealedLine
from ledger.errors import LedgerClosedError
from sandbox.policy.attempt_loop import decide_outcome
from sandbox.policy.attempt_record import QUEUED_MS, AttemptRecord
from sandbox.policy.attempts import AttemptDecision, Verdict
from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from sandbox.policy.lifecycle import TurnState, final_state
from sandbox.policy.safety import instruction_to_wire
from supervisor.errors import ClaimLostError, LedgerForkError, StaleClaimError
from supervisor.logging import get_logger, info_enabled
from supervisor.stages import stage_costs
from supervisor.store.fleet import StaleHomeError
from supervisor.store.protocol import Claim, PendingWrite, TurnEnding, TurnRecord
from supervisor.store.sealing import LineSeal
from supervisor.timers import Timers
from supervisor.traces import attempt_traceparent
from supervisor.turns.context import TurnDeps, log_fault, now_us, waited_ms, with_ending
from supervisor.turns.instruction import (
    BudgetGate,
    HubAttemptLike,
    attempt_result,
    build_envelope,
)
from supervisor.turns.tracker import ActiveTurn
from supervisor.wire.turn_spec import InstructionSpec

__all__ = ["DispatchingHub", "FlightOwner", "InstructionFlights"]

_COSTS = stage_costs()


@runtime_checkable
class DispatchingHub(Protocol):
    """A hub that takes an attempt without a task (`supervisor.executors.hub.ExecutorHub`)."""

    def dispatch(
        self,
        envelope: ExecutorInstructionEnvelope,
        wire: Mapping[str, object],
        *,
        traceparent: str | None,
        labels: Mapping[str, object],
        done: Callable[[HubAttemptLike], None],
    ) -> object | None:
        """Send the attempt to an executor with a free slot now and call *done* with its
        report (from the connection's reader, or its deadline); returns a handle for
        `abandon`, or None (nothing sent) when no slot is free or the circuit is not closed."""
        ...

    def abandon(self, handle: object) -> None:
        """The attempt's turn was cancelled or lost: tell the executor; *done* is not called."""
        ...


class FlightOwner(Protocol):
    """What the runner does for a flight that leaves the record path (in a task)."""

    def run_later(self, turn: TurnRecord, active: ActiveTurn) -> None:
        """The turn's next attempt cannot go straight to an executor: run it in a task."""

    def end_cancelled_later(self, turn: TurnRecord, active: ActiveTurn) -> None:
        """The turn was cancelled while its attempt was in flight: end it ``cancelled``."""

    def end_failed_later(self, turn: TurnRecord, active: ActiveTurn, exc: Exception) -> None:
        """Ending the turn failed for a reason other than a lost claim: end it as an error."""

    def released(self, active: ActiveTurn) -> None:
        """The turn left this daemon's hands (ended, lost): untrack it, wake the feeder."""

    def slot_returned(self) -> None:
        """An attempt gave its executor slot back: a parked turn may take it now."""


@dataclass(slots=True, eq=False)
class _Flight:
    turn: TurnRecord
    active: ActiveTurn
    spec: InstructionSpec
    record: AttemptRecord
    wire: Mapping[str, object]
    handle: object | None = None
    #: the answer arrived: the flight is deciding or ending, a cancel comes too late
    answered: bool = False


@dataclass(frozen=True, slots=True)
class _Ending:
    flight: _Flight
    ending: TurnEnding
    decided: AttemptRecord
    started: AttemptRecord | None
    evidence: bytes | None


def _labels(turn: TurnRecord) -> dict[str, object]:
    return {"session_id": turn.session_id, "turn_number": turn.turn_number, "turn_id": turn.turn_id}


class InstructionFlights:
    """Attempts of instruction turns in flight as records, and the pass that ends them."""

    def __init__(self, deps: TurnDeps, hub: DispatchingHub, owner: FlightOwner) -> None:
        self._deps = deps
        self._hub = hub
        self._owner = owner
        self._log = get_logger("supervisor.turns")
        self._with_evidence: list[_Ending] = []
        #: endings reached while this daemon's leases had lapsed: queued once a renewal round
        #: says whether their claims still hold
        self._for_lease: list[tuple[_Ending, TurnEnding]] = []
        self._wake = anyio.Event()
        self._timers = Timers()

    def launch(self, turn: TurnRecord, active: ActiveTurn, spec: InstructionSpec) -> bool:
        """Start the turn's next attempt on the record path; False (nothing done) when the
        attempt cannot go straight to an executor (the caller runs the turn in a task)."""
        deps = self._deps
        if deps.draining or active.claim is None or not deps.leases.live():
            return False  # the task path waits for a live lease (`LoopHooks.attempt_started`)
        started = _COSTS.clock()
        number = turn.attempt + 1
        tid = turn.turn_id
        queued_ms = waited_ms(active.ready_at)  # parked for a slot, if it was
        record = AttemptRecord(
            attempt=number,
            started_us=now_us(),
            instruction_id=f"INS-{tid}-{number}",
            extra=MappingProxyType({QUEUED_MS: queued_ms}),
        )
        envelope = build_envelope(spec, record, f"EXE-{tid}")
        wire = instruction_to_wire(envelope)
        flight = _Flight(turn, active, spec, record, wire)
        labels = _labels(turn)
        handle = self._hub.dispatch(
            envelope,
            wire,
            traceparent=attempt_traceparent(turn, record) if deps.traced else None,
            labels=labels,
            done=lambda report: self._answered(flight, report),
        )
        if handle is None:
            _COSTS.add("dispatch", _COSTS.clock() - started, 0)
            return False
        flight.handle = handle
        if number == 1:
            BudgetGate(deps).first_attempt()
        deps.tracker.attempt_started(active, number)
        deps.tracker.attempt_queued(spec.command_type.value, queued_ms)
        deps.starts.note(tid, lambda: self._write_start(flight))
        active.stop = lambda: self._stop(flight)
        if info_enabled():
            self._log.info(
                "attempt_started",
                attempt=number,
                instruction_id=record.instruction_id,
                command_type=spec.command_type.value,
                queued_ms=queued_ms,
                **labels,
            )
        _COSTS.add("dispatch", _COSTS.clock() - started)
        return True

    def _write_start(self, flight: _Flight) -> None:
        """Due (the attempt is still running): queue the start's write."""
        active = flight.active
        if active.claim is None or flight.answered:
            return
        record = flight.record

        def started(claim: Claim) -> None:
            if active.claim is not None:  # not lost or ended meanwhile
                active.claim = claim
            active.attempt = record.attempt
            active.move(TurnState.RUNNING)

        # Not waited on: the ending is queued after it and commits after it (or is refused
        # with it, under a claim lost meanwhile).
        self._deps.store.start_attempt_soon(active.claim, record, on_commit=started)

    def _stop(self, flight: _Flight) -> None:
        """The turn was cancelled or its claim lost while the attempt is in flight."""
        if flight.answered:
            return  # its ending is on its way; a cancel waits for it
        flight.answered = True
        active = flight.active
        active.stop = None
        self._deps.starts.take_back(active.turn_id)
        if flight.handle is not None:
            self._hub.abandon(flight.handle)
        self._deps.tracker.attempt_ended()
        if active.cancel_requested and active.claim is not None:
            self._owner.end_cancelled_later(flight.turn, active)
        else:
            self._owner.released(active)

    def _answered(self, flight: _Flight, report: HubAttemptLike) -> None:
        """The attempt's report (from the connection's reader or its deadline): decide."""
        if flight.answered:
            return
        flight.answered = True
        started_judging = _COSTS.clock()
        self._owner.slot_returned()
        deps = self._deps
        active = flight.active
        active.stop = None
        active.executor_id = report.executor_id
        started = flight.record if deps.starts.take_back(active.turn_id) else None
        detail = ": ".join(p for p in (report.safety_reason_code, report.detail) if p) or None
        record = replace(
            flight.record,
            executor_id=report.executor_id,
            detail=detail,
            duration_ms=report.duration_ms,
        )
        turn = flight.turn
        decided, decision = decide_outcome(
            record,
            report.outcome,
            phase=flight.spec.phase,
            options=deps.settings.retry,
            execution_id=f"EXE-{turn.turn_id}",
            instruction_id=record.instruction_id or "",
            finished_us=now_us(),
            retry_gate=BudgetGate(deps, command_type=flight.spec.command_type.value),
        )
        _COSTS.add("judge", _COSTS.clock() - started_judging, 0)  # the decision
        if decision.verdict is Verdict.RETRY:
            if started is not None:
                active.attempt = started.attempt
            self._retry(flight, decided, decision, started)
            return
        outcome = report.outcome
        ending = TurnEnding(
            state=final_state(outcome, decision),
            verdict=decision.verdict.name,
            reason_code=decision.reason_code,
            reason=decision.reason,
            fault_type=None if outcome.fault_type is None else outcome.fault_type.value,
            result=attempt_result(flight.wire, report, decided.detail, None),
        )
        item = _Ending(flight, ending, decided, started, report.evidence)
        if report.evidence is None:
            self._end(item, ending)
        else:  # the evidence bytes are written to the session first (a file: awaited)
            self._with_evidence.append(item)
            self._wake.set()

    async def run(self) -> None:
        """Serves the timers of the retries' backoffs, and ends the answered turns that
        brought evidence bytes: those are stored first (the others end from `_answered`)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._timers.run, name="retry-backoffs")
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                while self._with_evidence or self._for_lease:
                    batch, self._with_evidence = self._with_evidence, []
                    for item in batch:
                        await self._end_with_evidence(item)
                    held, self._for_lease = self._for_lease, []
                    for item, ending in held:
                        await self._end_when_live(item, ending)

    async def _end_when_live(self, item: _Ending, ending: TurnEnding) -> None:
        """An ending reached while the leases had lapsed: queued once they hold again, or
        refused (once, logged) when the renewal round found its claim lost."""
        active = item.flight.active
        try:
            await self._deps.leases.until_live(active)
        except ClaimLostError as exc:
            self._log.warning(
                "stale_result_refused", reason=exc.reason, **_labels(item.flight.turn)
            )
            self._deps.tracker.attempt_ended()
            self._owner.released(active)
            return
        self._end(item, ending)

    async def _end_with_evidence(self, item: _Ending) -> None:
        assert item.evidence is not None
        ending = item.ending
        stored = await self._deps.sessions.store_evidence(
            item.flight.turn.session_id, item.evidence
        )
        if stored is not None:  # else logged; the turn keeps its evidence_hash
            result = dict(ending.result)
            last = result.pop("last_instruction")
            ending = replace(
                ending, result={**result, "evidence": stored, "last_instruction": last}
            )
        self._end(item, ending)

    # -- a RETRY: recorded, its backoff on the timers, the next attempt sent: no task ---------

    def _retry(
        self,
        flight: _Flight,
        decided: AttemptRecord,
        decision: AttemptDecision,
        started: AttemptRecord | None,
    ) -> None:
        """Record the attempt decided RETRY (queued with the pass's writes); the backoff then
        waits on the timers (`_retry_recorded`)."""
        deps = self._deps
        active = flight.active
        claim = active.claim
        if claim is None:  # lost meanwhile: another daemon owns the turn now
            deps.tracker.attempt_ended()
            self._owner.released(active)
            return
        log_fault(decided, **_labels(flight.turn))
        next_us = now_us() + decision.delay_ms * 1000
        try:
            pending = deps.store.record_attempt_soon(
                claim, decided, next_attempt_us=next_us, started=started
            )
        except Exception as exc:  # a broken store: this turn, not the pass
            deps.tracker.attempt_ended()
            self._owner.end_failed_later(flight.turn, active, exc)
            return
        pending.when_done(
            functools.partial(self._retry_recorded, flight, decided, decision, next_us, pending)
        )

    def _retry_recorded(
        self,
        flight: _Flight,
        decided: AttemptRecord,
        decision: AttemptDecision,
        next_us: int,
        pending: PendingWrite[Claim],
    ) -> None:
        deps = self._deps
        active = flight.active
        turn = flight.turn
        labels = _labels(turn)
        deps.tracker.attempt_ended()
        try:
            claim = pending.outcome()
        except (StaleClaimError, StaleHomeError) as exc:  # another daemon owns it now
            self._log.warning("stale_result_refused", reason=str(exc), **labels)
            self._owner.released(active)
            return
        except Exception as exc:
            self._owner.end_failed_later(turn, active, exc)
            return
        if active.claim is not None:  # not lost meanwhile
            active.claim = claim
        active.attempt = decided.attempt
        active.move(TurnState.WAITING_RETRY)
        deps.tracker.retried(active.session_id, active.turn_id, decided)
        if info_enabled():
            self._log.info(
                "retry_scheduled",
                attempt=decided.attempt,
                delay_ms=decision.delay_ms,
                reason_code=decision.reason_code,
                **labels,
            )
        waiting = replace(
            turn, state=TurnState.WAITING_RETRY, attempt=decided.attempt, next_attempt_us=next_us
        )
        key = self._timers.call_at(
            time.monotonic() + decision.delay_ms / 1000,
            functools.partial(self._retry_due, waiting, active, flight.spec),
        )
        active.stop = functools.partial(self._stop_waiting, waiting, active, key)

    def _retry_due(self, turn: TurnRecord, active: ActiveTurn, spec: InstructionSpec) -> None:
        """The backoff is over: the next attempt goes (straight to a slot, else in a task)."""
        active.stop = None
        active.ready_at = time.monotonic()  # its queue wait counts from here
        if active.claim is None:  # lost during the backoff
            self._owner.released(active)
        elif active.cancel_requested:
            self._owner.end_cancelled_later(turn, active)
        elif self._deps.draining:  # it stays waiting_retry: a restart takes it back
            self._owner.released(active)
        elif not self.launch(turn, active, spec):
            self._owner.run_later(turn, active)

    def _stop_waiting(self, turn: TurnRecord, active: ActiveTurn, key: int) -> None:
        """Cancelled, or the claim lost, during the backoff."""
        self._timers.cancel(key)
        active.stop = None
        if active.cancel_requested and active.claim is not None:
            self._owner.end_cancelled_later(turn, active)
        else:
            self._owner.released(active)

    def _end(self, item: _Ending, ending: TurnEnding) -> None:
        """Seal the turn's lines and queue its ending: the endings queued in one pass of the
        event loop commit in one transaction; the store calls back when done with it."""
        deps = self._deps
        flight = item.flight
        active = flight.active
        claim = active.claim
        if claim is None:  # lost meanwhile: another daemon owns the turn now
            deps.tracker.attempt_ended()
            self._owner.released(active)
            return
        if not deps.leases.live():  # paused past the margin: does the claim still hold?
            self._for_lease.append((item, ending))
            self._wake.set()
            return
        log_fault(item.decided, **_labels(flight.turn))
        try:
            sealing = _COSTS.clock()
            # checked now, sealed by the store once the fence held (`store.sealing`)
            lines = deps.sessions.record_end(with_ending(flight.turn, ending, [item.decided]))
            _COSTS.add("seal", _COSTS.clock() - sealing)
            pending = deps.store.finish_soon(
                claim, ending, [item.decided], ledger_lines=lines, started=item.started
            )
        except ClaimLostError as exc:  # its session was dropped here: its home moved
            self._log.warning("stale_result_refused", reason=exc.reason, **_labels(flight.turn))
            deps.tracker.attempt_ended()
            self._owner.released(active)
            return
        except Exception as exc:  # a broken ledger or store: this turn, not the pass
            deps.tracker.attempt_ended()
            self._owner.end_failed_later(flight.turn, active, exc)
            return
        pending.when_done(functools.partial(self._committed, item, lines, pending))

    def _committed(self, item: _Ending, lines: LineSeal, pending: PendingWrite[TurnRecord]) -> None:
        try:
            finished = pending.outcome()
        except Exception as exc:
            self._not_ended(item, exc)
            return
        self._ended(item, lines.lines, finished)

    def _ended(self, item: _Ending, lines: Sequence[SealedLine], finished: TurnRecord) -> None:
        started = _COSTS.clock()
        deps = self._deps
        flight = item.flight
        active = flight.active
        session_id = flight.turn.session_id
        if lines:  # committed: the files may have them now
            deps.sessions.flush(session_id, lines)
        active.claim = None
        deps.tracker.remember(finished)
        deps.tracker.ended(finished, [item.decided], lines)
        active.move(finished.state)
        deps.tracker.attempt_ended()
        labels = _labels(flight.turn)
        if finished.final and info_enabled():
            self._log.info(
                "turn_finished",
                state=finished.state.value,
                attempts=len(finished.attempts),
                decision=finished.verdict,
                reason_code=finished.reason_code,
                duration_ms=(now_us() - flight.turn.accepted_us) // 1000,
                **labels,
            )
        elif not finished.final:
            self._log.info(
                "turn_escalated",
                attempt=finished.attempt,
                fault_type=finished.fault_type,
                reason_code=finished.reason_code,
                **labels,
            )
        _COSTS.add("commit", _COSTS.clock() - started, 0)
        self._owner.released(active)  # the waiters' answers count as "reply"

    def _not_ended(self, item: _Ending, exc: Exception) -> None:
        """The store refused or failed the ending: its lines were never sealed (or were
        withdrawn with the transaction), so the ledgers hold nothing of it."""
        deps = self._deps
        flight = item.flight
        active = flight.active
        labels = _labels(flight.turn)
        deps.tracker.attempt_ended()
        if isinstance(exc, LedgerClosedError):  # its session was dropped here meanwhile
            self._log.warning(
                "stale_result_refused", reason="its session was unloaded here", **labels
            )
        elif isinstance(exc, StaleClaimError):
            self._log.warning(
                "stale_result_refused", token=exc.token, current_token=exc.current_token, **labels
            )
        elif isinstance(exc, (StaleHomeError, LedgerForkError)):  # its session went on elsewhere
            self._log.warning("stale_result_refused", reason=str(exc), **labels)
            deps.stale_session(flight.turn.session_id)
        else:
            self._log.error("turn_failed", error_type=type(exc).__name__, error=str(exc), **labels)
            self._owner.end_failed_later(flight.turn, active, exc)
            return
        self._owner.released(active)
