"""The fencing rules of every store write, written once (both engines; pure, no I/O).

A daemon writes a turn only while it holds the turn's claim: the row's ``owner`` is the claim's
and its ``token`` (which only grows) is the claim's. A write whose claim was lost (the lease ran
out and another daemon took the turn, or the turn ended) is refused with `StaleClaimError` and
writes nothing, so a daemon that paused (GC, SIGSTOP, a network cut) never overwrites the work
of the one that took over. The state a write moves the turn to must be a legal move from the
row's state (`sandbox.policy.lifecycle`); an attempt start that was deferred (not yet written,
`supervisor.turns.starts`) comes with the write and counts as the move to ``running`` first.

Each engine reads the row its own way (SQLite: a plain select in the write transaction;
PostgreSQL: ``FOR UPDATE``, or the same rules as a ``WHERE`` clause, `finish_from`) and asks
here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES, LEGAL_MOVES, TurnState, check_move
from supervisor.errors import StaleClaimError, UnknownTurnError
from supervisor.store.protocol import Claim, TurnEnding
from supervisor.store.rows import dumps, loads

__all__ = [
    "FenceRow",
    "check_ending",
    "check_finish",
    "fence",
    "finish_from",
    "started_move",
    "stored_attempt",
    "with_start",
]


#: a turn's ``state``, ``owner``, ``token`` and ``round`` as an engine read them
FenceRow = tuple[str, str | None, int, int]


def fence(claim: Claim, row: FenceRow | None) -> tuple[TurnState, int]:
    """The turn's state and round when *claim* still holds it. *row*: the turn's ``state``,
    ``owner``, ``token`` and ``round`` as read (None: no such turn, `UnknownTurnError`);
    `StaleClaimError` when another owner or a newer token holds it, or nobody does."""
    if row is None:
        raise UnknownTurnError(claim.turn_id)
    state, owner, token, round_ = row
    if owner is None or owner != claim.owner or token != claim.token:
        raise StaleClaimError(
            claim.turn_id, token=claim.token, current_token=int(token), owner=claim.owner
        )
    return TurnState(state), int(round_)


def started_move(state: TurnState, started: AttemptRecord | None, turn_id: int) -> TurnState:
    """The state once an attempt start not written before (*started*) is applied."""
    if started is None:
        return state
    check_move(state, TurnState.RUNNING, turn_id=turn_id)
    return TurnState.RUNNING


def check_finish(
    claim: Claim,
    row: FenceRow | None,
    ending: TurnEnding,
    started: AttemptRecord | None,
) -> int:
    """Every check of an ending (the fence, the deferred start, the move); the turn's round."""
    state, round_ = fence(claim, row)
    check_move(started_move(state, started, claim.turn_id), ending.state, turn_id=claim.turn_id)
    return round_


def check_ending(ending: TurnEnding) -> None:
    """An ending is a final state or an escalation (ValueError, a caller's mistake)."""
    if ending.state not in FINAL_STATES and ending.state is not TurnState.ESCALATED:
        msg = f"finish needs a final state or escalated, not {ending.state.value}"
        raise ValueError(msg)


@cache
def finish_from(to_state: TurnState, started: bool) -> tuple[str, ...]:
    """The states from which a turn may move to *to_state* (through RUNNING when an attempt
    start not yet written comes with the write): the moves `check_move` allows, for an engine
    that checks them in SQL."""
    if started:
        if to_state not in LEGAL_MOVES.get(TurnState.RUNNING, frozenset()):
            return ()
        return tuple(s.value for s, moves in LEGAL_MOVES.items() if TurnState.RUNNING in moves)
    return tuple(s.value for s, moves in LEGAL_MOVES.items() if to_state in moves)


def with_start(
    attempts: tuple[AttemptRecord, ...], started: AttemptRecord | None
) -> tuple[AttemptRecord, ...]:
    """*attempts* plus the row of *started* unless its outcome (same number) is among them."""
    if started is None or any(a.attempt == started.attempt for a in attempts):
        return attempts
    return (started, *attempts)


def stored_attempt(attempt: AttemptRecord) -> AttemptRecord:
    """*attempt* as it reads back (``extra`` through the JSON round trip)."""
    return replace(attempt, extra=loads(dumps(attempt.extra))) if attempt.extra else attempt
