"""The turn lifecycle: its states, the table of legal moves, and the state a decision leads to.

This module is the only place that says which state a turn may move to. Every store checks each
move with `check_move` and refuses an illegal one with `IllegalTransition`, naming both states.

```
accepted ──▶ running ──▶ waiting_retry ──▶ running ...
   │            │  └──────▶ escalated ──▶ accepted (operator: retry) | terminated | cancelled
   │            └──────────▶ final
   └──▶ cancelled | rejected | terminated
```

Final states never change again. ``escalated`` parks a turn until a person decides. A turn found
``running`` after a crash (or a lost lease) had its attempt interrupted: that attempt is a CRASH
fault (`interrupted_outcome`) and goes through the policy like any other attempt, so the turn
moves on from ``running`` by the same table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from sandbox.policy.attempts import AttemptDecision, AttemptOutcome, OutcomeKind, Verdict
from sandbox.policy.faults import ExecutionFaultType

__all__ = [
    "FINAL_STATES",
    "LEGAL_MOVES",
    "IllegalTransition",
    "TurnKind",
    "TurnState",
    "check_move",
    "final_state",
    "interrupted_outcome",
    "is_final",
    "state_after",
]


class TurnKind(enum.StrEnum):
    """What runs a turn: an external executor (instruction) or the sandbox (process)."""

    INSTRUCTION = "instruction"
    PROCESS = "process"


class TurnState(enum.StrEnum):
    """Where a turn stands. The values are stored and shown; never rename one."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    WAITING_RETRY = "waiting_retry"
    ESCALATED = "escalated"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TERMINATED = "terminated"
    EXHAUSTED = "exhausted"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    VIOLATION = "violation"
    REJECTED = "rejected"


FINAL_STATES: Final[frozenset[TurnState]] = frozenset(
    {
        TurnState.SUCCEEDED,
        TurnState.FAILED,
        TurnState.TERMINATED,
        TurnState.EXHAUSTED,
        TurnState.CANCELLED,
        TurnState.TIMEOUT,
        TurnState.VIOLATION,
        TurnState.REJECTED,
    }
)

#: Where an attempt's decision may lead from ``running``: any final state, a retry, a person.
_AFTER_ATTEMPT: Final = FINAL_STATES | {TurnState.WAITING_RETRY, TurnState.ESCALATED}

#: The table of legal moves. A state missing on the left has no way out (the final ones).
LEGAL_MOVES: Final[Mapping[TurnState, frozenset[TurnState]]] = {
    # Runs, or ends before its first attempt: cancelled by the client, refused by the sandbox
    # at its start (rejected), or its session could not be resumed after a restart (terminated).
    TurnState.ACCEPTED: frozenset(
        {TurnState.RUNNING, TurnState.CANCELLED, TurnState.REJECTED, TurnState.TERMINATED}
    ),
    TurnState.RUNNING: _AFTER_ATTEMPT,
    # The backoff ends in the next attempt, or the turn ends while it waits.
    TurnState.WAITING_RETRY: frozenset(
        {TurnState.RUNNING, TurnState.CANCELLED, TurnState.TERMINATED, TurnState.REJECTED}
    ),
    # An operator retries (a fresh attempt budget) or terminates; a client may cancel.
    TurnState.ESCALATED: frozenset({TurnState.ACCEPTED, TurnState.TERMINATED, TurnState.CANCELLED}),
}


class IllegalTransition(Exception):
    """Raised when a turn is asked to move from one state to another that the table forbids.

    A store raises it instead of writing the move; it means a bug (or a hostile row), never
    bad client input.
    """

    def __init__(
        self, from_state: TurnState, to_state: TurnState, *, turn_id: int | None = None
    ) -> None:
        self.from_state = from_state
        self.to_state = to_state
        self.turn_id = turn_id
        which = f"turn {turn_id}" if turn_id is not None else "a turn"
        allowed = ", ".join(sorted(s.value for s in LEGAL_MOVES.get(from_state, frozenset())))
        super().__init__(
            f"{which} cannot move from {from_state.value} to {to_state.value}"
            f" (allowed from {from_state.value}: {allowed or 'nothing, it is final'})"
        )


def is_final(state: TurnState) -> bool:
    """True for the states a turn never leaves."""
    return state in FINAL_STATES


def check_move(from_state: TurnState, to_state: TurnState, *, turn_id: int | None = None) -> None:
    """Raise `IllegalTransition` unless the table allows ``from_state -> to_state``."""
    if to_state not in LEGAL_MOVES.get(from_state, frozenset()):
        raise IllegalTransition(from_state, to_state, turn_id=turn_id)


_OUTCOME_STATE: Final[Mapping[OutcomeKind, TurnState]] = {
    OutcomeKind.FAILURE: TurnState.FAILED,
    OutcomeKind.REFUSED: TurnState.TERMINATED,
}
_FAULT_STATE: Final[Mapping[ExecutionFaultType, TurnState]] = {
    ExecutionFaultType.TIMEOUT: TurnState.TIMEOUT,
    ExecutionFaultType.SECURITY_VIOLATION: TurnState.VIOLATION,
}


def final_state(outcome: AttemptOutcome, decision: AttemptDecision) -> TurnState:
    """The state a turn ends in (or is parked in) when *decision* is not RETRY.

    SUCCEED -> succeeded; EXHAUSTED -> exhausted; ESCALATE -> escalated; otherwise by the
    outcome: a failure -> failed, a refusal -> terminated, a TIMEOUT fault -> timeout, a
    SECURITY_VIOLATION -> violation, anything else -> terminated.
    """
    if decision.verdict is Verdict.RETRY:
        msg = "a RETRY decision does not end a turn; use state_after"
        raise ValueError(msg)
    if decision.verdict is Verdict.SUCCEED:
        return TurnState.SUCCEEDED
    if decision.verdict is Verdict.EXHAUSTED:
        return TurnState.EXHAUSTED
    if decision.verdict is Verdict.ESCALATE:
        return TurnState.ESCALATED
    by_outcome = _OUTCOME_STATE.get(outcome.kind)
    if by_outcome is not None:
        return by_outcome
    if outcome.fault_type is not None:
        return _FAULT_STATE.get(outcome.fault_type, TurnState.TERMINATED)
    return TurnState.TERMINATED


def state_after(outcome: AttemptOutcome, decision: AttemptDecision) -> TurnState:
    """The state a running turn moves to once *decision* is taken on its attempt."""
    if decision.verdict is Verdict.RETRY:
        return TurnState.WAITING_RETRY
    return final_state(outcome, decision)


def interrupted_outcome(attempt_number: int) -> AttemptOutcome:
    """The outcome of an attempt that a crash, a stop or a lost lease interrupted: a CRASH fault.

    Written once, here: after a restart or a takeover the interrupted attempt goes through the
    policy like any other, so it is retried, ends the turn or escalates as the tables say.
    """
    return AttemptOutcome.fault(
        ExecutionFaultType.CRASH,
        f"attempt {attempt_number} was interrupted (the daemon running it stopped or lost it)",
    )
