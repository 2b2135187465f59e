"""The tracker: the daemon's in-memory view of its active turns (`supervisor.turns.tracker`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import anyio

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.feed import Feed
from supervisor.store.protocol import Claim, TurnRecord
from supervisor.turns import tracker as tracker_module
from supervisor.turns.tracker import ActiveTurn, Tracker, TurnEvents
from tests.turn_requests import READ_SPEC, TRUE_SPEC

#: Every wait below is bounded by this; none should come near it.
_BOUND_S = 5


@dataclass
class RecordingEvents:
    """A `TurnEvents` sink that keeps every call, in order."""

    calls: list[tuple[str, object]] = field(default_factory=list)

    def attempt_decided(self, attempt: AttemptRecord) -> None:
        self.calls.append(("attempt_decided", attempt))

    def attempt_queued(self, command_type: str, seconds: float) -> None:
        self.calls.append(("attempt_queued", (command_type, seconds)))

    def turn_ended(self, turn: TurnRecord, ledger_lines: Sequence[SealedLine]) -> None:
        self.calls.append(("turn_ended", (turn, tuple(ledger_lines))))

    def intake_refused(self, capability: str) -> None:
        self.calls.append(("intake_refused", capability))

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        self.calls.append(("ledgers_verified", (ledgers, failures)))


def _turn(
    turn_id: int = 1,
    state: TurnState = TurnState.ACCEPTED,
    *,
    session_id: str = "s-1",
    kind: TurnKind = TurnKind.INSTRUCTION,
    attempt: int = 0,
    accepted_us: int = 1_000,
) -> TurnRecord:
    return TurnRecord(
        turn_id=turn_id,
        session_id=session_id,
        turn_number=turn_id,
        kind=kind,
        spec=READ_SPEC if kind is TurnKind.INSTRUCTION else TRUE_SPEC,
        idempotency_key=None,
        state=state,
        attempt=attempt,
        accepted_us=accepted_us,
        updated_us=accepted_us,
    )


def _claim(turn: TurnRecord, token: int = 1) -> Claim:
    return Claim(turn=turn, owner="daemon-a", token=token, lease_until_us=10**12)


def _attempt(number: int = 1, decision: str | None = "RETRY") -> AttemptRecord:
    return AttemptRecord(attempt=number, started_us=2_000, decision=decision)


def _line(seq: int, role: str = "exec") -> SealedLine:
    return SealedLine(ledger_id=f"s-1/{role}", seq=seq, entry_hash=f"h{seq}", line=b"{}\n")


async def _blocked() -> None:
    """Return once every other task is blocked (a waiter has registered its event)."""
    await anyio.wait_all_tasks_blocked()


# -- counting


async def test_a_turn_through_a_retry_to_success_is_counted_as_the_runner_reports_it() -> None:
    """Track, start, retry, start again, end, remove: each step shows in the statistics."""
    tracker = Tracker()
    turn = _turn(accepted_us=1_234)
    tracker.accepted(turn)
    active = tracker.add(turn, _claim(turn))
    stats = tracker.statistics()
    assert (stats.turns_active, stats.turns_queued, stats.oldest_queued_us) == (1, 1, 1_234)
    assert (stats.accepted_total, stats.attempts_running) == (1, 0)

    tracker.attempt_started()
    active.move(TurnState.RUNNING)
    stats = tracker.statistics()
    assert (stats.attempts_running, stats.turns_queued, stats.oldest_queued_us) == (1, 0, None)
    assert stats.process_turns_running == 0

    tracker.retried(turn.session_id, turn.turn_id, _attempt(1))
    active.move(TurnState.WAITING_RETRY)
    tracker.attempt_ended()
    stats = tracker.statistics()
    assert (stats.attempts_running, stats.turns_waiting_retry) == (0, 1)

    tracker.attempt_started()
    active.move(TurnState.RUNNING)
    finished = replace(turn, state=TurnState.SUCCEEDED, attempt=2)
    tracker.remember(finished)
    tracker.ended(finished, [_attempt(2, "SUCCEED")])
    active.move(finished.state)
    tracker.attempt_ended()
    stats = tracker.statistics()
    assert (stats.turns_active, stats.turns_waiting_retry, stats.attempts_running) == (1, 0, 0)
    assert (stats.finished_total, dict(stats.finished_by_state)) == (1, {"succeeded": 1})

    tracker.remove(active)
    stats = tracker.statistics()
    assert (stats.turns_active, stats.finished_total, stats.accepted_total) == (0, 1, 1)
    assert len(tracker) == 0
    assert tracker.get(turn.turn_id) is None


async def test_an_escalated_turn_counts_as_escalated_while_active_and_never_as_finished() -> None:
    """`ended` on an escalated turn counts no finish; the active turn counts as escalated."""
    tracker = Tracker()
    turn = _turn()
    active = tracker.add(turn, _claim(turn))
    escalated = replace(turn, state=TurnState.ESCALATED, attempt=1)
    tracker.ended(escalated, [_attempt(1, "ESCALATE")])
    active.move(TurnState.ESCALATED)
    stats = tracker.statistics()
    assert (stats.turns_escalated, stats.finished_total) == (1, 0)
    assert stats.finished_by_state == {}
    tracker.remove(active)
    assert tracker.statistics().turns_escalated == 0


async def test_finished_turns_are_counted_by_final_state() -> None:
    """`finished_by_state` keeps one counter per final state's value."""
    tracker = Tracker()
    for turn_id, state in enumerate(
        [TurnState.SUCCEEDED, TurnState.FAILED, TurnState.SUCCEEDED, TurnState.CANCELLED], 1
    ):
        tracker.ended(_turn(turn_id, state))
    stats = tracker.statistics()
    assert stats.finished_total == 4
    assert stats.finished_by_state == {"succeeded": 2, "failed": 1, "cancelled": 1}
    assert stats.to_dict()["finished_by_state"] == {"succeeded": 2, "failed": 1, "cancelled": 1}


async def test_process_attempts_are_counted_apart_and_within_all_attempts() -> None:
    """A process attempt counts in both `attempts_running` and `process_turns_running`."""
    tracker = Tracker()
    tracker.attempt_started(process=True)
    tracker.attempt_started()
    stats = tracker.statistics()
    assert (stats.attempts_running, stats.process_turns_running) == (2, 1)
    tracker.attempt_ended(process=True)
    stats = tracker.statistics()
    assert (stats.attempts_running, stats.process_turns_running) == (1, 0)
    assert tracker.attempts_running == 1


async def test_the_oldest_queued_turn_is_the_earliest_accepted_one_not_yet_started() -> None:
    """Turns still `accepted` are queued; the oldest acceptance time is reported."""
    tracker = Tracker()
    tracker.add(_turn(1, accepted_us=5_000), None)
    tracker.add(_turn(2, accepted_us=3_000), None)
    started = tracker.add(_turn(3, accepted_us=1_000), None)
    started.move(TurnState.RUNNING)
    stats = tracker.statistics()
    assert (stats.turns_active, stats.turns_queued, stats.oldest_queued_us) == (3, 2, 3_000)


async def test_wait_idle_returns_once_the_last_running_attempt_ends() -> None:
    """A drain's `wait_idle` blocks while attempts run and returns when the count is zero."""
    tracker = Tracker()
    with anyio.fail_after(_BOUND_S):
        await tracker.wait_idle()  # nothing running: at once
    tracker.attempt_started()
    tracker.attempt_started(process=True)
    idle: list[int] = []

    async def drain() -> None:
        await tracker.wait_idle()
        idle.append(tracker.attempts_running)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await _blocked()
            tracker.attempt_ended()
            await _blocked()
            assert idle == []
            tracker.attempt_ended(process=True)
    assert idle == [0]


# -- the active turn's moves and waits


async def test_add_copies_the_records_fields_into_the_active_turn() -> None:
    """`add` builds the active turn from the record and its claim, and `get` finds it."""
    tracker = Tracker()
    turn = _turn(7, TurnState.RUNNING, session_id="s-9", kind=TurnKind.PROCESS, attempt=2)
    claim = _claim(turn)
    active = tracker.add(turn, claim)
    assert tracker.get(7) is active
    assert (active.turn_id, active.session_id, active.turn_number) == (7, "s-9", 7)
    assert (active.kind, active.state, active.attempt) == (TurnKind.PROCESS, TurnState.RUNNING, 2)
    assert (active.claim, active.accepted_us) == (claim, 1_000)
    assert (active.settled, active.done, active.cancel_requested) == (False, False, False)


async def test_wait_changed_returns_on_each_move_and_then_waits_for_the_next() -> None:
    """Every `move` wakes the change waiters once; a new wait needs a new move."""
    active = Tracker().add(_turn(), None)
    seen: list[TurnState] = []

    async def watch() -> None:
        for _ in range(2):
            await active.wait_changed()
            seen.append(active.state)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await _blocked()
            active.move(TurnState.RUNNING)
            await _blocked()
            assert seen == [TurnState.RUNNING]
            active.move(TurnState.WAITING_RETRY)
    assert seen == [TurnState.RUNNING, TurnState.WAITING_RETRY]


async def test_wait_changed_returns_when_the_turn_is_removed() -> None:
    """Removal counts as a change (its state unchanged), so `until` waits see the turn gone."""
    tracker = Tracker()
    active = tracker.add(_turn(), None)
    active.move(TurnState.RUNNING)
    woke: list[bool] = []

    async def watch() -> None:
        await active.wait_changed()
        woke.append(tracker.get(active.turn_id) is None)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await _blocked()
            tracker.remove(active)
    assert woke == [True]
    assert active.state is TurnState.RUNNING


async def test_wait_settled_returns_for_every_waiter_once_the_turn_settles() -> None:
    """All settle waiters wake on `settle`; a later wait returns at once."""
    active = Tracker().add(_turn(), None)
    woke: list[str] = []

    async def wait(name: str) -> None:
        await active.wait_settled()
        woke.append(name)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "a")
            tg.start_soon(wait, "b")
            await _blocked()
            assert woke == []
            active.move(TurnState.ESCALATED)
            active.settle()
        assert sorted(woke) == ["a", "b"]
        assert active.settled
        assert not active.done
        await active.wait_settled()


async def test_wait_settled_returns_when_a_final_turn_is_removed() -> None:
    """The runner's path: the turn moves to its final state, then `remove` settles it."""
    tracker = Tracker()
    turn = _turn()
    active = tracker.add(turn, _claim(turn))
    states: list[TurnState] = []

    async def wait() -> None:
        await active.wait_settled()
        states.append(active.state)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await _blocked()
            active.move(TurnState.RUNNING)
            active.move(TurnState.SUCCEEDED)
            tracker.remove(active)
    assert states == [TurnState.SUCCEEDED]
    assert active.settled


async def test_wait_finished_returns_once_the_turn_is_removed() -> None:
    """`wait_finished` (a cancel's wait) blocks until `remove`, then returns at once."""
    tracker = Tracker()
    active = tracker.add(_turn(), None)
    done: list[bool] = []

    async def wait() -> None:
        await active.wait_finished()
        done.append(active.done)

    with anyio.fail_after(_BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await _blocked()
            active.move(TurnState.CANCELLED)
            active.settle()
            await _blocked()
            assert done == []  # neither a final state nor settling finishes it
            tracker.remove(active)
        assert done == [True]
        await active.wait_finished()


async def test_removing_a_replaced_active_turn_keeps_its_replacement() -> None:
    """`remove` drops a turn id only while it maps to that same active turn."""
    tracker = Tracker()
    turn = _turn()
    old = tracker.add(turn, _claim(turn, token=1))
    new = tracker.add(turn, _claim(turn, token=2))
    tracker.remove(old)
    assert old.done
    assert tracker.get(turn.turn_id) is new
    assert not new.done
    assert len(tracker) == 1


async def test_sessions_claims_and_in_flight_describe_the_active_turns() -> None:
    """`in_session`, `claims` and `in_flight` (oldest first, limited) read the active turns."""
    tracker = Tracker()
    third = _turn(3, session_id="s-2")
    tracker.add(third, _claim(third))
    tracker.add(_turn(1), None)
    second = _turn(2)
    tracker.add(second, _claim(second))
    assert sorted(tracker.in_session("s-1")) == [1, 2]
    assert tracker.in_session("s-2") == [3]
    assert sorted(c.turn_id for c in tracker.claims()) == [2, 3]
    assert sorted(a.turn_id for a in tracker) == [1, 2, 3]
    flight = tracker.in_flight(2)
    assert [row["turn_id"] for row in flight] == [1, 2]
    assert flight[0] == {
        "turn_id": 1,
        "session_id": "s-1",
        "turn_number": 1,
        "kind": "instruction",
        "state": "accepted",
        "attempt": 0,
        "executor_id": None,
    }
    assert len(tracker.in_flight()) == 3


# -- recently finished


async def test_a_finished_turn_is_served_from_the_recent_cache_once_removed() -> None:
    """After `remember` and `remove`, `recent` gives the finished record without the store."""
    tracker = Tracker()
    turn = _turn()
    active = tracker.add(turn, _claim(turn))
    finished = replace(turn, state=TurnState.SUCCEEDED)
    tracker.remember(finished)
    assert tracker.recent(turn.turn_id) is None  # still active: the live view answers
    tracker.remove(active)
    assert tracker.recent(turn.turn_id) is finished
    assert tracker.recent(99) is None


async def test_only_final_turns_are_remembered() -> None:
    """An escalated (parked) turn is not final, so it is never served from the cache."""
    tracker = Tracker()
    tracker.remember(_turn(1, TurnState.ESCALATED))
    tracker.remember(_turn(2, TurnState.WAITING_RETRY))
    assert tracker.recent(1) is None
    assert tracker.recent(2) is None


async def test_the_recent_cache_is_bounded_and_drops_the_least_recently_remembered() -> None:
    """At most `_RECENT` finished turns are kept; remembering one again keeps it longer."""
    tracker = Tracker()
    bound = tracker_module._RECENT
    for turn_id in range(1, bound + 1):
        tracker.remember(_turn(turn_id, TurnState.SUCCEEDED))
    refreshed = _turn(1, TurnState.FAILED)
    tracker.remember(refreshed)  # turn 1 becomes the newest; turn 2 is now the oldest
    tracker.remember(_turn(bound + 1, TurnState.SUCCEEDED))
    assert tracker.recent(1) is refreshed
    assert tracker.recent(2) is None
    assert tracker.recent(3) is not None
    assert tracker.recent(bound + 1) is not None


# -- the events sink


async def test_ended_passes_the_turn_and_its_ledger_lines_to_the_sink_once() -> None:
    """`ended` reports each decided attempt, then the turn with its lines, exactly once."""
    events = RecordingEvents()
    sink: TurnEvents = events
    tracker = Tracker(events=sink)
    finished = _turn(state=TurnState.SUCCEEDED, attempt=2)
    decided = _attempt(2, "SUCCEED")
    undecided = _attempt(3, None)
    lines = [_line(4), _line(5, "evidence")]
    tracker.ended(finished, [decided, undecided], lines)
    assert events.calls == [
        ("attempt_decided", decided),
        ("turn_ended", (finished, tuple(lines))),
    ]
    assert tracker.statistics().finished_total == 1


async def test_an_escalation_then_its_resolution_are_two_endings_for_the_sink() -> None:
    """Escalated, then resolved final: the sink hears of each ending; one finish is counted."""
    events = RecordingEvents()
    tracker = Tracker(events=events)
    escalated = _turn(state=TurnState.ESCALATED, attempt=1)
    resolved = replace(escalated, state=TurnState.TERMINATED)
    tracker.ended(escalated, [_attempt(1, "ESCALATE")], [_line(1)])
    tracker.ended(resolved, ledger_lines=[_line(2)])
    ended = [payload for name, payload in events.calls if name == "turn_ended"]
    assert ended == [(escalated, (_line(1),)), (resolved, (_line(2),))]
    assert dict(tracker.statistics().finished_by_state) == {"terminated": 1}


async def test_retries_refusals_and_verifications_are_forwarded_to_the_sink() -> None:
    """`retried`, `intake_refused` and `ledgers_verified` each reach the sink as given."""
    events = RecordingEvents()
    tracker = Tracker(events=events)
    retry = _attempt(1, "RETRY")
    tracker.retried("S1", 1, retry)
    tracker.intake_refused("write")
    tracker.ledgers_verified(ledgers=3, failures=1)
    assert events.calls == [
        ("attempt_decided", retry),
        ("intake_refused", "write"),
        ("ledgers_verified", (3, 1)),
    ]


async def test_without_a_sink_the_tracker_still_counts() -> None:
    """No sink: every report is dropped, and `ended` still counts the finish."""
    tracker = Tracker()
    tracker.retried("S1", 1, _attempt(1))
    tracker.intake_refused("execute")
    tracker.ledgers_verified(ledgers=1, failures=0)
    tracker.ended(_turn(state=TurnState.FAILED), [_attempt(1, "FAIL")], [_line(1)])
    assert dict(tracker.statistics().finished_by_state) == {"failed": 1}


async def test_an_active_turn_is_a_plain_object_not_compared_by_value() -> None:
    """Two active turns built alike are distinct (`remove` relies on identity)."""
    first = ActiveTurn(1, "s-1", 1, TurnKind.INSTRUCTION, TurnState.ACCEPTED, None)
    second = ActiveTurn(1, "s-1", 1, TurnKind.INSTRUCTION, TurnState.ACCEPTED, None)
    assert first != second


async def test_what_happens_to_a_turn_goes_to_the_feed_in_order() -> None:
    """With a feed (`supervisor.feed`), the tracker publishes a turn's acceptance, its
    attempts' starts and decisions, and its ending, in the order they happened."""
    feed = Feed(epoch="e1")
    tracker = Tracker(feed=feed)
    turn = _turn(accepted_us=1_234)
    tracker.accepted(turn)
    active = tracker.add(turn, _claim(turn))
    tracker.attempt_started(active, 1)
    tracker.retried(turn.session_id, turn.turn_id, _attempt(1, "RETRY"))
    tracker.attempt_started(active, 2)
    ended = replace(_turn(state=TurnState.SUCCEEDED), attempt=2)
    tracker.ended(ended, [_attempt(2, "SUCCEED")])
    events = list(feed.recent())
    assert [(e.kind, e.attempt) for e in events] == [
        ("turn.accepted", None),
        ("attempt.started", 1),
        ("attempt.ended", 1),
        ("attempt.started", 2),
        ("attempt.ended", 2),
        ("turn.ended", 2),
    ]
    assert {e.turn_id for e in events} == {turn.turn_id}
    assert events[2].decision == "RETRY"
    assert events[-1].state == "succeeded"
    assert [e.cursor for e in events] == [f"e1:{n}" for n in range(1, 7)]
