"""The fencing rules both engines use (`supervisor.store.fencing`): pure, checked here once;
the engines' use of them is the conformance suite's (`conformance.py`)."""

from __future__ import annotations

import pytest

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import IllegalTransition, TurnState, check_move
from supervisor.errors import StaleClaimError, UnknownTurnError
from supervisor.store.fencing import (
    check_ending,
    check_finish,
    fence,
    finish_from,
    with_start,
)
from supervisor.store.protocol import Claim, TurnEnding, TurnRecord
from tests.supervisor.store.conformance import attempt, instruction


def _claim(turn_id: int = 7, owner: str = "A", token: int = 3) -> Claim:
    new = instruction()
    turn = TurnRecord(
        turn_id=turn_id,
        session_id=new.session_id,
        turn_number=1,
        kind=new.kind,
        spec=new.spec,
        idempotency_key=None,
        state=TurnState.ACCEPTED,
        attempt=0,
        accepted_us=1,
        updated_us=1,
        owner=owner,
        token=token,
    )
    return Claim(turn=turn, owner=owner, token=token, lease_until_us=10**15)


def test_the_claims_holder_passes_the_fence_with_the_rows_state_and_round() -> None:
    assert fence(_claim(), ("running", "A", 3, 2)) == (TurnState.RUNNING, 2)


@pytest.mark.parametrize(
    "row",
    [("running", "B", 3, 0), ("running", "A", 4, 0), ("succeeded", None, 3, 0)],
    ids=["another owner", "a newer token", "nobody (ended or released)"],
)
def test_a_lost_claim_is_refused_naming_both_tokens(row: tuple[str, str | None, int, int]) -> None:
    with pytest.raises(StaleClaimError) as caught:
        fence(_claim(), row)
    assert "turn 7" in str(caught.value)
    assert f"is now {row[2]}" in str(caught.value)


def test_an_unknown_turn_is_refused() -> None:
    with pytest.raises(UnknownTurnError):
        fence(_claim(), None)


@pytest.mark.parametrize("started", [False, True])
@pytest.mark.parametrize("to_state", list(TurnState))
def test_the_sql_states_are_exactly_the_moves_check_move_allows(
    to_state: TurnState, started: bool
) -> None:
    """What the PostgreSQL engine checks in SQL (`finish_from`) is what `check_move` allows,
    with a deferred start counting as the move to running first."""
    allowed = set(finish_from(to_state, started))
    for state in TurnState:
        try:
            if started:
                check_move(state, TurnState.RUNNING, turn_id=1)
                check_move(TurnState.RUNNING, to_state, turn_id=1)
            else:
                check_move(state, to_state, turn_id=1)
        except IllegalTransition:
            assert state.value not in allowed, (state, to_state)
        else:
            assert state.value in allowed, (state, to_state)


def test_an_ending_checks_the_deferred_start_before_the_move() -> None:
    ending = TurnEnding(state=TurnState.SUCCEEDED)
    assert check_finish(_claim(), ("accepted", "A", 3, 0), ending, attempt(1)) == 0
    with pytest.raises(IllegalTransition):  # accepted -> failed needs an attempt first
        check_finish(_claim(), ("accepted", "A", 3, 0), TurnEnding(state=TurnState.FAILED), None)
    with pytest.raises(StaleClaimError):  # the fence first, whatever the move
        check_finish(_claim(), ("accepted", "B", 3, 0), ending, attempt(1))


def test_finish_takes_only_final_states_or_an_escalation() -> None:
    check_ending(TurnEnding(state=TurnState.ESCALATED))
    with pytest.raises(ValueError, match="not running"):
        check_ending(TurnEnding(state=TurnState.RUNNING))


def test_a_deferred_start_is_written_unless_its_outcome_is_among_the_rows() -> None:
    done: AttemptRecord = attempt(1, decision="SUCCEED")
    assert with_start((done,), attempt(1)) == (done,)
    assert with_start((done,), None) == (done,)
    assert with_start((attempt(2, decision="SUCCEED"),), attempt(1))[0] == attempt(1)
