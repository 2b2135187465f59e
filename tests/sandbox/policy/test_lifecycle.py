"""The turn lifecycle (sandbox/policy/lifecycle.py): the table of moves, the state a decision
leads to, the interrupted attempt, and a property test that drives random event sequences
through a small pure model of a turn."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    OutcomeKind,
    RetryOptions,
    Verdict,
    decide_attempt,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.lifecycle import (
    FINAL_STATES,
    LEGAL_MOVES,
    IllegalTransition,
    TurnState,
    check_move,
    final_state,
    interrupted_outcome,
    is_final,
    state_after,
)

S = TurnState
ALL_PAIRS = list(itertools.product(TurnState, TurnState))
LEGAL = [(a, b) for a, b in ALL_PAIRS if b in LEGAL_MOVES.get(a, frozenset())]
ILLEGAL = [(a, b) for a, b in ALL_PAIRS if b not in LEGAL_MOVES.get(a, frozenset())]


# -- the table -------------------------------------------------------------------------------


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_every_legal_move_is_allowed(from_state: TurnState, to_state: TurnState) -> None:
    check_move(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_every_other_move_is_refused_naming_both_states(
    from_state: TurnState, to_state: TurnState
) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_move(from_state, to_state, turn_id=7)
    error = info.value
    assert (error.from_state, error.to_state, error.turn_id) == (from_state, to_state, 7)
    message = str(error)
    assert f"from {from_state.value} to {to_state.value}" in message
    assert message.startswith("turn 7 cannot move")


def test_illegal_move_without_turn_id_says_a_turn() -> None:
    with pytest.raises(IllegalTransition, match=r"^a turn cannot move from accepted to succeeded"):
        check_move(S.ACCEPTED, S.SUCCEEDED)


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
def test_final_states_have_no_way_out(state: TurnState) -> None:
    assert is_final(state)
    assert state not in LEGAL_MOVES
    for target in TurnState:
        with pytest.raises(IllegalTransition, match="nothing, it is final"):
            check_move(state, target)


def test_non_final_states_all_have_moves() -> None:
    """Every state is either final or has a way out (no state is a dead end by accident)."""
    for state in TurnState:
        assert is_final(state) != bool(LEGAL_MOVES.get(state))
    assert set(LEGAL_MOVES) == {S.ACCEPTED, S.RUNNING, S.WAITING_RETRY, S.ESCALATED}


def test_running_may_reach_every_final_state_retry_and_escalation() -> None:
    assert LEGAL_MOVES[S.RUNNING] == FINAL_STATES | {S.WAITING_RETRY, S.ESCALATED}


# -- the state a decision leads to -----------------------------------------------------------


def _decision(verdict: Verdict) -> AttemptDecision:
    return AttemptDecision(verdict, "CODE", "reason")


OK = AttemptOutcome.success()
FAIL = AttemptOutcome.failure(1)
REFUSED = AttemptOutcome.refused("no")


def _fault(kind: ExecutionFaultType) -> AttemptOutcome:
    return AttemptOutcome.fault(kind)


@pytest.mark.parametrize(
    ("outcome", "verdict", "expected"),
    [
        (OK, Verdict.SUCCEED, S.SUCCEEDED),
        (FAIL, Verdict.EXHAUSTED, S.EXHAUSTED),
        (_fault(ExecutionFaultType.RESOURCE_EXHAUSTED), Verdict.ESCALATE, S.ESCALATED),
        (FAIL, Verdict.TERMINATE, S.FAILED),
        (REFUSED, Verdict.TERMINATE, S.TERMINATED),
        (_fault(ExecutionFaultType.TIMEOUT), Verdict.TERMINATE, S.TIMEOUT),
        (_fault(ExecutionFaultType.SECURITY_VIOLATION), Verdict.TERMINATE, S.VIOLATION),
        (_fault(ExecutionFaultType.CRASH), Verdict.TERMINATE, S.TERMINATED),
        (_fault(ExecutionFaultType.PARTIAL), Verdict.TERMINATE, S.TERMINATED),
        (_fault(ExecutionFaultType.INVALID_RESPONSE), Verdict.TERMINATE, S.TERMINATED),
        (_fault(ExecutionFaultType.RESOURCE_EXHAUSTED), Verdict.TERMINATE, S.TERMINATED),
        (OK, Verdict.TERMINATE, S.TERMINATED),
    ],
)
def test_final_state_for_each_verdict_and_outcome(
    outcome: AttemptOutcome, verdict: Verdict, expected: TurnState
) -> None:
    assert final_state(outcome, _decision(verdict)) is expected
    assert state_after(outcome, _decision(verdict)) is expected
    check_move(S.RUNNING, expected)


def test_retry_is_not_a_final_state() -> None:
    with pytest.raises(ValueError, match="RETRY decision does not end a turn"):
        final_state(FAIL, _decision(Verdict.RETRY))
    assert state_after(FAIL, _decision(Verdict.RETRY)) is S.WAITING_RETRY


def test_every_verdict_leads_somewhere_legal_from_running() -> None:
    outcomes = [OK, FAIL, REFUSED, *(_fault(f) for f in ExecutionFaultType)]
    for outcome, verdict in itertools.product(outcomes, Verdict):
        check_move(S.RUNNING, state_after(outcome, _decision(verdict)))


# -- the interrupted attempt ---------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 3, 10])
def test_interrupted_outcome_is_a_crash_fault(attempt: int) -> None:
    outcome = interrupted_outcome(attempt)
    assert outcome.kind is OutcomeKind.FAULT
    assert outcome.fault_type is ExecutionFaultType.CRASH
    assert f"attempt {attempt} was interrupted" in outcome.message


def test_interrupted_attempt_goes_through_the_policy() -> None:
    """Retried within the budget in GREEN, ends the turn on the last attempt or in RED."""
    options = RetryOptions()
    first = decide_attempt(
        interrupted_outcome(1), phase=AgentPhase.GREEN, attempt_number=1, options=options
    )
    assert first.verdict is Verdict.RETRY
    assert first.reason_code == rc.RETRY_AFTER_CRASH
    last = decide_attempt(
        interrupted_outcome(3), phase=AgentPhase.GREEN, attempt_number=3, options=options
    )
    assert last.verdict is Verdict.TERMINATE
    assert last.reason_code == rc.CRASH_RETRY_LIMIT_REACHED
    assert state_after(interrupted_outcome(3), last) is S.TERMINATED
    red = decide_attempt(
        interrupted_outcome(1), phase=AgentPhase.RED, attempt_number=1, options=options
    )
    assert red.reason_code == rc.PHASE_NOT_RETRYABLE


# -- property: random event sequences through a pure model -----------------------------------

OUTCOMES = st.one_of(
    st.just(OK),
    st.builds(AttemptOutcome.failure, st.sampled_from([1, 2, 3, 124, 125, 126, 127, 128, 137])),
    st.builds(AttemptOutcome.fault, st.sampled_from(list(ExecutionFaultType))),
    st.just(REFUSED),
)

EVENTS = st.one_of(
    st.just(("start",)),
    st.tuples(st.just("decided"), OUTCOMES),
    st.just(("backoff_elapsed",)),
    st.tuples(st.just("resolve"), st.sampled_from(["retry", "terminate", "cancel"])),
    st.just(("cancel",)),
    st.just(("crash_recovery",)),
)


@dataclass(slots=True)
class TurnModel:
    """A turn as the daemon drives it: a state, the attempt number within the budget."""

    phase: AgentPhase | None
    options: RetryOptions
    state: TurnState = TurnState.ACCEPTED
    attempt: int = 0  # the attempt running or last decided; 0 before the first
    moves: int = 0

    def move(self, to_state: TurnState) -> None:
        check_move(self.state, to_state)
        self.state = to_state
        self.moves += 1

    def decide(self, outcome: AttemptOutcome) -> AttemptDecision:
        decision = decide_attempt(
            outcome, phase=self.phase, attempt_number=self.attempt, options=self.options
        )
        # the policy never asks for an attempt beyond the budget
        if decision.verdict is Verdict.RETRY:
            assert self.attempt < self.options.max_attempts
        self.move(state_after(outcome, decision))
        return decision

    def apply(self, event: tuple[object, ...]) -> bool:
        """Apply *event* if it can happen in the current state; True when it did."""
        name = event[0]
        state = self.state
        if name in {"start", "backoff_elapsed"}:
            if name == "start" and state is S.ACCEPTED:
                self.attempt = 1
            elif name == "backoff_elapsed" and state is S.WAITING_RETRY:
                self.attempt += 1
            else:
                return False
            self.move(S.RUNNING)
            return True
        if name == "decided" and state is S.RUNNING:
            outcome = event[1]
            assert isinstance(outcome, AttemptOutcome)
            self.decide(outcome)
            return True
        if name == "crash_recovery" and state is S.RUNNING:
            self.decide(interrupted_outcome(self.attempt))
            return True
        if name == "resolve" and state is S.ESCALATED:
            target = {"retry": S.ACCEPTED, "terminate": S.TERMINATED, "cancel": S.CANCELLED}
            self.move(target[str(event[1])])
            if self.state is S.ACCEPTED:
                self.attempt = 0  # an operator's retry gives a fresh budget
            return True
        if name == "cancel" and state in {S.ACCEPTED, S.WAITING_RETRY, S.ESCALATED}:
            self.move(S.CANCELLED)
            return True
        return False

    def check_invariants(self) -> None:
        assert isinstance(self.state, TurnState)
        assert 0 <= self.attempt <= self.options.max_attempts
        if self.state in {S.RUNNING, S.WAITING_RETRY}:
            assert self.attempt >= 1


@settings(max_examples=300, deadline=None)
@given(
    phase=st.one_of(st.none(), st.sampled_from(list(AgentPhase))),
    max_attempts=st.integers(min_value=1, max_value=4),
    events=st.lists(EVENTS, max_size=40),
    finishing=st.lists(OUTCOMES, min_size=1, max_size=8),
)
def test_random_event_sequences_stay_legal_and_always_finish(
    phase: AgentPhase | None,
    max_attempts: int,
    events: list[tuple[object, ...]],
    finishing: list[AttemptOutcome],
) -> None:
    turn = TurnModel(phase=phase, options=RetryOptions(max_attempts=max_attempts))
    for event in events:
        before = turn.state
        applied = turn.apply(event)
        if not applied:
            assert turn.state is before
        if is_final(before):
            assert not applied  # nothing moves a final turn
        turn.check_invariants()
    # Drive to completion: attempts keep coming (outcomes cycle), escalations are terminated.
    outcomes = itertools.cycle(finishing)
    bound = 2 * max_attempts + 3
    for _ in range(bound):
        if is_final(turn.state):
            break
        if turn.state is S.ACCEPTED:
            turn.apply(("start",))
        elif turn.state is S.WAITING_RETRY:
            turn.apply(("backoff_elapsed",))
        elif turn.state is S.RUNNING:
            turn.apply(("decided", next(outcomes)))
        elif turn.state is S.ESCALATED:
            turn.apply(("resolve", "terminate"))
        turn.check_invariants()
    assert is_final(turn.state), f"not finished after {bound} steps: {turn.state}"
