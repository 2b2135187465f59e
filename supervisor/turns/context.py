"""What the turn runners share: the store, the tracker, the sessions, settings; and the hooks
through which the one attempt loop's steps become durable (fenced store writes) and visible
(log events, the tracker).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.attempts import AttemptDecision, RetryOptions
from sandbox.policy.budget import BudgetLimits, RetryBudget
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import ClaimLostError
from supervisor.logging import get_logger
from supervisor.store.protocol import Claim, PendingWrite, TurnEnding, TurnRecord, TurnStore
from supervisor.store.sealing import LineSeal
from supervisor.turns.anchors import LedgerAnchors, Tail
from supervisor.turns.leases import LeaseClock
from supervisor.turns.sessions import DaemonSessions
from supervisor.turns.starts import DeferredStarts
from supervisor.turns.tracker import ActiveTurn, Tracker

__all__ = [
    "CoreSettings",
    "Drain",
    "LiveSettings",
    "LoopHooks",
    "TurnDeps",
    "end_turn",
    "log_fault",
    "merge_attempts",
    "now_us",
    "waited_ms",
    "with_ending",
]


def now_us() -> int:
    """Wall-clock time in integer microseconds since the epoch (the ledgers' unit)."""
    return time.time_ns() // 1000


def waited_ms(since: float) -> int:
    """Whole milliseconds from *since* (`time.monotonic`) to now: an attempt's queue wait."""
    return max(0, int((time.monotonic() - since) * 1000))


@dataclass(frozen=True, slots=True)
class CoreSettings:
    root: Path = Path(".hunter")
    retry: RetryOptions = field(default_factory=RetryOptions)
    process_slots: int = 4
    default_timeout_ms: int = 30_000
    wait_limit_s: float = 3600.0
    #: how long a claim holds without renewal; renewed every third of it
    lease_ms: int = 30_000
    #: how often the ledger files and their heads are synced (a turn's lines are durable in
    #: the store at once; the store keeps them until then). A round syncs four files a session
    #: whatever it holds: every second instead of every 250 ms took ~25 µs of CPU off a turn at
    #: 64 sessions (docs/performance.md, issue 30's sixth step)
    ledger_sync_interval_s: float = 1.0
    #: the daemon-wide retry budget of instruction turns (`[retry] budget_*`)
    retry_budget: BudgetLimits = field(default_factory=BudgetLimits)


class LiveSettings:
    """The turn core's settings as they are now: a SIGHUP reload replaces them whole (each
    value is frozen; a runner reads them when it needs them, so a reload applies from the next
    read on)."""

    __slots__ = ("current",)

    def __init__(self, settings: CoreSettings) -> None:
        self.current = settings


class Drain:
    """Set once, when the daemon begins to drain: no session opens, no turn is admitted and
    no attempt starts after it."""

    __slots__ = ("_begun",)

    def __init__(self) -> None:
        self._begun = False

    def begin(self) -> None:
        self._begun = True

    @property
    def begun(self) -> bool:
        return self._begun


@dataclass(frozen=True, slots=True)
class TurnDeps:
    """The neighbours a turn runner works with (owned by `TurnCore`, lent to the runners),
    fixed when the core is built; what changes later is behind its own small object (the
    settings a reload replaces, the drain)."""

    store: TurnStore
    tracker: Tracker
    sessions: DaemonSessions
    live: LiveSettings
    owner: str
    process_limiter: anyio.CapacityLimiter
    starts: DeferredStarts = field(default_factory=DeferredStarts)
    drain: Drain = field(default_factory=Drain)
    #: in a fleet (a shared store): what of the ledger files the store holds
    anchors: LedgerAnchors | None = None
    #: traces are on: each attempt's envelope goes with its W3C traceparent
    traced: bool = False
    #: first attempts and retries of instruction turns in the budget's window
    retry_budget: RetryBudget = field(default_factory=RetryBudget)
    #: this daemon's leases by its own clock (enforced in a fleet): no work without one
    leases: LeaseClock = field(default_factory=LeaseClock.unenforced)
    #: in a fleet: whether a session is still homed here under a live home lease
    homed: Callable[[str], Awaitable[bool]] | None = None
    #: in a fleet: the store refused a session's line from here as another chain's (a fork)
    #: or its ending as another home's: this daemon's copy is stale (`Fleet.stale`)
    stale_session: Callable[[str], None] = field(default=lambda _sid: None)

    @property
    def settings(self) -> CoreSettings:
        return self.live.current

    @property
    def draining(self) -> bool:
        return self.drain.begun


async def lease_gate(deps: TurnDeps, active: ActiveTurn) -> None:
    """No attempt, promotion or ending without a live lease: wait, after a pause past the
    margin, for the renewal round that says whether the turn's claim still holds, and (in a
    fleet) whether its session is still homed here. `ClaimLostError` when either was lost:
    nothing of the turn is started or recorded here."""
    await deps.leases.until_live(active)
    if deps.homed is not None and not await deps.homed(active.session_id):
        raise ClaimLostError(
            active.turn_id, reason=f"its session {active.session_id} is homed by another daemon"
        )


def merge_attempts(
    stored: Sequence[AttemptRecord], new: Sequence[AttemptRecord]
) -> tuple[AttemptRecord, ...]:
    """The turn's attempts with *new* ones replacing stored ones of the same number."""
    replaced = {a.attempt for a in new}
    return (*(a for a in stored if a.attempt not in replaced), *new)


def with_ending(
    turn: TurnRecord, ending: TurnEnding, attempts: Sequence[AttemptRecord] = ()
) -> TurnRecord:
    """The record as it will be once *ending* is stored (for the ledger entries written first)."""
    return replace(
        turn,
        state=ending.state,
        verdict=ending.verdict,
        reason_code=ending.reason_code,
        reason=ending.reason,
        fault_type=ending.fault_type,
        result=dict(ending.result),
        attempts=merge_attempts(turn.attempts, attempts),
    )


class LoopHooks:
    """`AttemptHooks` for one turn: fenced store writes, the tracker, the log events."""

    def __init__(
        self,
        deps: TurnDeps,
        active: ActiveTurn,
        *,
        process: bool = False,
        overlap_start: bool = False,
        **log_ids: object,
    ) -> None:
        self._deps = deps
        self._active = active
        self._process = process
        self._overlap_start = overlap_start
        self._starting: PendingWrite[Claim] | None = None
        self._unwritten: AttemptRecord | None = None
        self._log_ids: Mapping[str, object] = log_ids
        #: true from an attempt's start until its outcome is durable (the drain waits for it)
        self.counting = False
        #: the next attempt's wait so far, for its ``attempt_started`` when its record does not
        #: carry one yet (an instruction turn parked in the core; the hub's part comes later)
        self.queued_ms = 0

    @property
    def claim(self) -> Claim:
        claim = self._active.claim
        if claim is None:
            msg = f"turn {self._active.turn_id} has no claim"
            raise RuntimeError(msg)
        return claim

    async def attempt_started(self, attempt: AttemptRecord) -> None:
        """Without ``overlap_start`` the start is durable before the attempt runs. With it
        (instruction turns, a process turn's first attempt): only noted
        (`starts.DeferredStarts`); it is written if the attempt outlives a short delay, else
        it rides with the outcome (`take_unwritten_start`)."""
        # No attempt without a live lease: after a pause, the next renewal round says whether
        # the claim still holds (`ClaimLostError` when it does not; nothing starts).
        await lease_gate(self._deps, self._active)
        # Counted from here: a drain waits for an attempt whose envelope may be on its way.
        self._deps.tracker.attempt_started(self._active, attempt.attempt, process=self._process)
        self.counting = True
        if self._overlap_start:
            self._unwritten = attempt
            self._deps.starts.note(self._active.turn_id, self._write_start)
            self._log_started(attempt)  # dispatched now, whenever its start is written
            return
        self._started(attempt, await self._deps.store.start_attempt(self.claim, attempt))
        self._log_started(attempt)

    def _write_start(self) -> None:
        """Due (the attempt is still running): queue the start's write."""
        attempt, self._unwritten = self._unwritten, None
        if attempt is None or self._active.claim is None:  # ended or lost meanwhile
            return
        self._starting = self._deps.store.start_attempt_soon(
            self._active.claim, attempt, on_commit=lambda claim: self._started(attempt, claim)
        )

    async def commit_start(self) -> None:
        """The attempt's answer is in: take back a start not yet written (it rides with the
        outcome), or wait for the written one's commit (a refused start raises here)."""
        if self._deps.starts.take_back(self._active.turn_id):
            return
        pending, self._starting = self._starting, None
        if pending is not None:
            await pending.result()

    def forget_start(self) -> None:
        """The attempt was cancelled: its start is never written."""
        self._deps.starts.take_back(self._active.turn_id)
        self._unwritten = None

    def take_unwritten_start(self) -> AttemptRecord | None:
        """The start that rides with the next store write of this turn (None when written)."""
        attempt, self._unwritten = self._unwritten, None
        if attempt is not None:
            self._active.attempt = attempt.attempt
        return attempt

    def _started(self, attempt: AttemptRecord, claim: Claim) -> None:
        if self._active.claim is not None:  # not lost or ended meanwhile
            self._active.claim = claim
        self._active.attempt = attempt.attempt
        self._active.move(TurnState.RUNNING)

    def _log_started(self, attempt: AttemptRecord) -> None:
        queued = attempt.queued_ms
        if queued is None:
            queued, self.queued_ms = self.queued_ms, 0
        get_logger("supervisor.turns").info(
            "attempt_started",
            attempt=attempt.attempt,
            instruction_id=attempt.instruction_id,
            queued_ms=queued,
            **self._log_ids,
        )

    async def retry_scheduled(
        self, attempt: AttemptRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        log = get_logger("supervisor.turns")
        self.log_fault(attempt)
        self._active.claim = await self._deps.store.record_attempt(
            self.claim,
            attempt,
            next_attempt_us=next_attempt_us,
            started=self.take_unwritten_start(),
        )
        self._active.move(TurnState.WAITING_RETRY)
        self._deps.tracker.retried(self._active.session_id, self._active.turn_id, attempt)
        self.stop_counting()
        log.info(
            "retry_scheduled",
            attempt=attempt.attempt,
            delay_ms=decision.delay_ms,
            reason_code=decision.reason_code,
        )

    def log_fault(self, attempt: AttemptRecord) -> None:
        log_fault(attempt)  # the turn's ids come from its task's context

    def stop_counting(self) -> None:
        if self.counting:
            self.counting = False
            self._deps.tracker.attempt_ended(process=self._process)


def log_fault(attempt: AttemptRecord, **ids: object) -> None:
    """``fault_classified`` for an attempt decided on a fault (nothing for any other)."""
    if attempt.outcome != "FAULT":
        return
    get_logger("supervisor.turns").info(
        "fault_classified",
        attempt=attempt.attempt,
        fault_type=attempt.fault_type,
        decision=attempt.decision,
        reason_code=attempt.reason_code,
        duration_ms=attempt.duration_ms,
        detail=attempt.detail,
        executor_id=attempt.executor_id,
        instruction_id=attempt.instruction_id,
        **ids,
    )


async def end_turn(
    deps: TurnDeps,
    turn: TurnRecord,
    active: ActiveTurn,
    ending: TurnEnding,
    attempts: Sequence[AttemptRecord] = (),
    *,
    pending: LineSeal | None = None,
    started: AttemptRecord | None = None,
) -> TurnRecord:
    """End (or park) *turn* under its claim in one durable step: the turn's exec and evidence
    entries are made here, or come *pending* from the sandbox runtime; the store seals them
    once the ending's fence held and commits them with it in one transaction (a refused ending
    never takes a seq: `supervisor.store.sealing`); then the tracker and the log. Sealed lines
    stay out of the files until the commit is done, so a crash leaves both of a turn's lines in
    the files, or neither.

    The files get the lines from their writers and are synced later in rounds
    (`DaemonSessions.sync_ledgers`); after a crash the store gives back what they lost.
    """
    # No ending queued without a live lease; a claim lost meanwhile (a renewal round found it
    # taken over, the session's home moved) refuses the ending here, once: `ClaimLostError`.
    await lease_gate(deps, active)
    claim = active.claim
    if claim is None:
        raise ClaimLostError(turn.turn_id, reason="its claim was lost before it could end")
    if pending is None:
        seal = deps.sessions.record_end(with_ending(turn, ending, attempts))
    else:  # the sandbox runtime made them
        seal = pending
    tail: Tail | None = None
    if deps.anchors is not None and pending is not None:
        # In a fleet the runtime's own lines (violations) go with it.
        seal, tail = await deps.anchors.with_pending(deps.sessions.get(turn.session_id), seal)
    # A refused or failed ending raises here with nothing sealed (or its lines withdrawn).
    finished = await deps.store.finish(claim, ending, attempts, ledger_lines=seal, started=started)
    lines = seal.lines
    if deps.anchors is not None:
        if tail is not None:
            deps.anchors.advance(tail)
        deps.anchors.noted(lines)
    if lines:  # committed: the files may have them now (both lines, or neither after a crash)
        deps.sessions.flush(turn.session_id, lines)
    active.claim = None
    deps.tracker.remember(finished)
    deps.tracker.ended(finished, attempts, lines)
    active.move(finished.state)
    log = get_logger("supervisor.turns")
    if finished.final:
        log.info(
            "turn_finished",
            state=finished.state.value,
            attempts=len(finished.attempts),
            decision=finished.verdict,
            reason_code=finished.reason_code,
            duration_ms=(now_us() - turn.accepted_us) // 1000,
        )
    else:
        log.info(
            "turn_escalated",
            attempt=finished.attempt,
            fault_type=finished.fault_type,
            reason_code=finished.reason_code,
        )
    return finished
