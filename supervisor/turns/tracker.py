"""What this daemon knows, in memory, about the turns it is running: the live view.

The store holds the truth; the tracker holds what only a running daemon has: each active turn's
claim, its cancel scope, who waits for it, and counters for `hunter status`. It never touches
the store. Waiters are woken through events created only when someone waits (most turns have
one waiter or none: an event per state change per turn showed up in profiles).

What happens to turns is also reported, as it happens, to an optional `TurnEvents` sink (the
daemon's metrics): each decided attempt, each ending (final or escalated) with the ledger lines
it committed, capability refusals at intake, and ledger verifications. The tracker only forwards;
the sink keeps its own counters.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.feed import Feed
from supervisor.logging import get_logger
from supervisor.store.protocol import Claim, TurnRecord
from supervisor.turns.decisions import Decision

__all__ = ["ActiveTurn", "Tracker", "TrackerStatistics", "TurnEvents"]


class TurnEvents(Protocol):
    """Where the tracker reports what happened to turns (`supervisor.metrics.DaemonMetrics`).

    Called on the event loop, synchronously: an implementation only counts, never blocks."""

    def attempt_decided(self, attempt: AttemptRecord) -> None:
        """An attempt got its outcome and decision (RETRY, or the one that ended the turn)."""

    def attempt_queued(self, command_type: str, seconds: float) -> None:
        """An attempt waited *seconds* before it ran (or before it gave up waiting): for an
        executor slot of *command_type*, or (``process``) for its session's lock and a process
        slot (the attempt's ``queued_ms``)."""

    def turn_ended(self, turn: TurnRecord, ledger_lines: Sequence[SealedLine]) -> None:
        """A turn reached a final state or was escalated; *ledger_lines* committed with it."""

    def intake_refused(self, capability: str) -> None:
        """A turn was refused at intake for violating *capability* (written to the evidence)."""

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        """A ledger verification checked *ledgers* ledgers and found *failures* broken."""


#: Finished turns kept in memory so that waits and gets right after the end skip the store.
_RECENT = 4096


@dataclass(slots=True, eq=False)
class ActiveTurn:
    """One turn this daemon is running (or has parked and still watches)."""

    turn_id: int
    session_id: str
    turn_number: int
    kind: TurnKind
    state: TurnState
    claim: Claim | None
    attempt: int = 0
    #: when the store accepted the turn (µs since the epoch; the intake age)
    accepted_us: int = 0
    #: since when (`time.monotonic`) the turn's next attempt may run: this daemon took the
    #: turn (accepted it, took it over, an operator's retry) or a retry's backoff ended. The
    #: attempt's queue wait counts from here.
    ready_at: float = 0.0
    executor_id: str | None = None
    scope: anyio.CancelScope | None = None
    #: stops an attempt in flight without a task of its own (`flights`): cancel, claim lost
    stop: Callable[[], None] | None = None
    cancel_requested: bool = False
    #: who asked for the cancel, and why: recorded with the ending (`decisions`)
    decided_by: Decision | None = None
    #: true once the turn is final or parked: `wait` returns
    settled: bool = False
    done: bool = False
    _changed: anyio.Event | None = None
    _settled: anyio.Event | None = None
    _finished: anyio.Event | None = None
    _resolving: bool = field(default=False)
    #: called once when the turn settles (`TurnCore.settled_soon`: waits without a task)
    _watchers: list[Callable[[], None]] | None = None

    def move(self, state: TurnState) -> None:
        self.state = state
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def interrupt(self) -> None:
        """Stop what runs the turn now: its task's cancel scope, or its attempt in flight."""
        if self.scope is not None:
            self.scope.cancel()
        elif self.stop is not None:
            self.stop()

    def settle(self) -> None:
        self.settled = True
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()
        watchers, self._watchers = self._watchers, None
        for watcher in watchers or ():
            try:
                watcher()
            except Exception:  # a watcher's bug: logged; the turn and the others go on
                get_logger("supervisor.turns").exception(
                    "turn_watcher_failed", turn_id=self.turn_id
                )

    def watch(self, watcher: Callable[[], None]) -> None:
        """Call *watcher* once when the turn settles."""
        if self._watchers is None:
            self._watchers = []
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[], None]) -> None:
        if self._watchers is not None and watcher in self._watchers:
            self._watchers.remove(watcher)

    def finish(self) -> None:
        self.done = True
        self.settle()
        if self._finished is not None:
            self._finished.set()
        self.move(self.state)

    async def wait_changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    async def wait_settled(self) -> None:
        if self.settled:
            return
        if self._settled is None:
            self._settled = anyio.Event()
        await self._settled.wait()

    async def wait_finished(self) -> None:
        if self.done:
            return
        if self._finished is None:
            self._finished = anyio.Event()
        await self._finished.wait()


@dataclass(frozen=True, slots=True)
class TrackerStatistics:
    turns_active: int
    attempts_running: int
    turns_waiting_retry: int
    turns_escalated: int
    process_turns_running: int
    accepted_total: int
    finished_total: int
    finished_by_state: Mapping[str, int]
    #: accepted turns whose first attempt has not started (waiting for a slot), and the
    #: acceptance time of the oldest of them (None when there is none)
    turns_queued: int = 0
    oldest_queued_us: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "turns_active": self.turns_active,
            "turns_queued": self.turns_queued,
            "oldest_queued_us": self.oldest_queued_us,
            "attempts_running": self.attempts_running,
            "turns_waiting_retry": self.turns_waiting_retry,
            "turns_escalated": self.turns_escalated,
            "process_turns_running": self.process_turns_running,
            "accepted_total": self.accepted_total,
            "finished_total": self.finished_total,
            "finished_by_state": dict(self.finished_by_state),
        }


class Tracker:
    """The active turns of this daemon, the recently finished ones, and the counters."""

    def __init__(self, *, events: TurnEvents | None = None, feed: Feed | None = None) -> None:
        self._events = events
        #: the change feed that subscribers follow (`supervisor.feed`); None: nobody can
        self.feed = feed
        self._active: dict[int, ActiveTurn] = {}
        self._recent: collections.OrderedDict[int, TurnRecord] = collections.OrderedDict()
        self._attempts_running = 0
        self._process_running = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._accepted_total = 0
        self._finished_total = 0
        self._finished_by_state: collections.Counter[str] = collections.Counter()

    # -- active turns
    def add(self, turn: TurnRecord, claim: Claim | None) -> ActiveTurn:
        active = ActiveTurn(
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            turn_number=turn.turn_number,
            kind=turn.kind,
            state=turn.state,
            claim=claim,
            attempt=turn.attempt,
            accepted_us=turn.accepted_us,
            ready_at=time.monotonic(),
        )
        self._active[turn.turn_id] = active
        return active

    def get(self, turn_id: int) -> ActiveTurn | None:
        return self._active.get(turn_id)

    def remove(self, active: ActiveTurn) -> None:
        if self._active.get(active.turn_id) is active:
            del self._active[active.turn_id]
        active.finish()

    def __iter__(self) -> Iterator[ActiveTurn]:
        return iter(list(self._active.values()))

    def __len__(self) -> int:
        return len(self._active)

    def in_session(self, session_id: str) -> list[int]:
        return [a.turn_id for a in self._active.values() if a.session_id == session_id]

    def claims(self) -> list[Claim]:
        return [a.claim for a in self._active.values() if a.claim is not None]

    # -- recently finished
    def remember(self, turn: TurnRecord) -> None:
        if not turn.final:
            return
        self._recent[turn.turn_id] = turn
        self._recent.move_to_end(turn.turn_id)
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    def recent(self, turn_id: int) -> TurnRecord | None:
        if turn_id in self._active:
            return None
        return self._recent.get(turn_id)

    # -- counters
    def accepted(self, turn: TurnRecord) -> None:
        self._accepted_total += 1
        if self.feed is not None:
            self.feed.publish(
                "turn.accepted", session_id=turn.session_id, turn_id=turn.turn_id, state="accepted"
            )

    def finished(self, state: TurnState) -> None:
        self._finished_total += 1
        self._finished_by_state[state.value] += 1

    def ended(
        self,
        turn: TurnRecord,
        attempts: Sequence[AttemptRecord] = (),
        ledger_lines: Sequence[SealedLine] = (),
    ) -> None:
        """*turn* reached a final state or was escalated, deciding *attempts* (those not
        reported before through `retried`) and committing *ledger_lines* with its ending."""
        if turn.final:
            self.finished(turn.state)
        feed = self.feed
        if feed is not None:
            for attempt in attempts:
                if attempt.decision is not None:
                    _attempt_ended(feed, turn.session_id, turn.turn_id, attempt)
            feed.publish(
                "turn.ended" if turn.final else "escalation.raised",
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                state=turn.state.value,
                attempt=turn.attempt,
                decision=turn.verdict,
                reason_code=turn.reason_code,
            )
        if self._events is None:
            return
        for attempt in attempts:
            if attempt.decision is not None:
                self._events.attempt_decided(attempt)
        self._events.turn_ended(turn, ledger_lines)

    def retried(self, session_id: str, turn_id: int, attempt: AttemptRecord) -> None:
        """*attempt* was decided RETRY (its record is final; the turn goes on)."""
        if self.feed is not None:
            _attempt_ended(self.feed, session_id, turn_id, attempt)
        if self._events is not None:
            self._events.attempt_decided(attempt)

    def escalation_resolved(self, turn: TurnRecord, action: str) -> None:
        """An operator resolved escalated *turn* with *action* (retry or terminate)."""
        if self.feed is not None:
            self.feed.publish(
                "escalation.resolved",
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                state=turn.state.value,
                decision=action,
            )

    def intake_refused(self, capability: str) -> None:
        if self._events is not None:
            self._events.intake_refused(capability)

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        if self._events is not None:
            self._events.ledgers_verified(ledgers=ledgers, failures=failures)

    def attempt_started(
        self, active: ActiveTurn | None = None, attempt: int = 0, *, process: bool = False
    ) -> None:
        """An attempt of *active*'s turn (number *attempt*) began."""
        if active is not None and self.feed is not None:
            self.feed.publish(
                "attempt.started",
                session_id=active.session_id,
                turn_id=active.turn_id,
                state="running",
                attempt=attempt,
            )
        self._attempts_running += 1
        if process:
            self._process_running += 1
        if self._idle.is_set():
            self._idle = anyio.Event()

    def attempt_queued(self, command_type: str, queued_ms: int) -> None:
        """An attempt's queue wait is known (`TurnEvents.attempt_queued`)."""
        if self._events is not None:
            self._events.attempt_queued(command_type, queued_ms / 1000)

    def attempt_ended(self, *, process: bool = False) -> None:
        self._attempts_running -= 1
        if process:
            self._process_running -= 1
        if self._attempts_running == 0:
            self._idle.set()

    @property
    def attempts_running(self) -> int:
        return self._attempts_running

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def statistics(self) -> TrackerStatistics:
        active = list(self._active.values())
        queued = [a.accepted_us for a in active if a.state is TurnState.ACCEPTED]
        return TrackerStatistics(
            turns_active=len(active),
            attempts_running=self._attempts_running,
            turns_waiting_retry=sum(1 for a in active if a.state is TurnState.WAITING_RETRY),
            turns_escalated=sum(1 for a in active if a.state is TurnState.ESCALATED),
            process_turns_running=self._process_running,
            accepted_total=self._accepted_total,
            finished_total=self._finished_total,
            finished_by_state=dict(self._finished_by_state),
            turns_queued=len(queued),
            oldest_queued_us=min(queued) if queued else None,
        )

    def in_flight(self, limit: int | None = None) -> list[dict[str, object]]:
        """The active turns, oldest first (at most *limit*)."""
        active = sorted(self._active.values(), key=lambda a: a.turn_id)
        if limit is not None:
            active = active[:limit]
        return [
            {
                "turn_id": a.turn_id,
                "session_id": a.session_id,
                "turn_number": a.turn_number,
                "kind": a.kind.value,
                "state": a.state.value,
                "attempt": a.attempt,
                "executor_id": a.executor_id,
            }
            for a in active
        ]


def _attempt_ended(feed: Feed, session_id: str, turn_id: int, attempt: AttemptRecord) -> None:
    feed.publish(
        "attempt.ended",
        session_id=session_id,
        turn_id=turn_id,
        attempt=attempt.attempt,
        decision=attempt.decision,
        reason_code=attempt.reason_code,
        executor_id=attempt.executor_id,
        detail=attempt.outcome,
    )
