"""The change feed itself (`supervisor.feed`): filters, the ring, resuming, cutting off."""

from __future__ import annotations

import pytest

from supervisor.feed import Event, EventFilter, Feed, Subscriber


def _follow(
    feed: Feed,
    event_filter: EventFilter | None = None,
    *,
    after: str | None = None,
    room: int = 1_000,
) -> tuple[Subscriber, list[Event], list[str]]:
    got: list[Event] = []
    cuts: list[str] = []

    def deliver(event: Event, body: bytes) -> bool:
        assert body == feed.encode(event)  # the body is the event's own encoding
        if len(got) >= room:
            return False
        got.append(event)
        return True

    sub = Subscriber(event_filter or EventFilter(), deliver, cuts.append)
    replay = feed.subscribe(sub, after=after)
    for event in replay.events:
        sub.offer(event, feed.encode(event))
    return sub, got, cuts


def test_a_filter_passes_only_the_sessions_turns_and_kinds_it_names() -> None:
    feed = Feed(epoch="e")
    _, by_session, _ = _follow(feed, EventFilter(sessions=frozenset({"A"})))
    _, by_turn, _ = _follow(feed, EventFilter(turns=frozenset({2})))
    _, ends, _ = _follow(feed, EventFilter(kinds=frozenset({"turn.ended"})))
    _, everything, _ = _follow(feed)
    feed.publish("turn.accepted", session_id="A", turn_id=1)
    feed.publish("turn.accepted", session_id="B", turn_id=2)
    feed.publish("turn.ended", session_id="B", turn_id=2, state="succeeded")
    feed.publish("executor.connected", executor_id="x", command_types=("READ",))
    assert [e.turn_id for e in by_session] == [1]
    assert [(e.kind, e.turn_id) for e in by_turn] == [("turn.accepted", 2), ("turn.ended", 2)]
    assert [e.kind for e in ends] == ["turn.ended"]
    assert [e.seq for e in everything] == [1, 2, 3, 4]


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValueError, match=r"unknown event kinds \['turn\.done'\]"):
        EventFilter(kinds=frozenset({"turn.done"}))


def test_resuming_after_a_cursor_replays_what_was_missed_once() -> None:
    feed = Feed(epoch="e")
    for n in range(1, 6):
        feed.publish("turn.accepted", session_id="A", turn_id=n)
    _, got, _ = _follow(feed, after="e:3")
    feed.publish("turn.accepted", session_id="A", turn_id=6)
    assert [e.turn_id for e in got] == [4, 5, 6]


def test_a_cursor_of_another_run_or_past_the_ring_is_a_gap_not_an_error() -> None:
    feed = Feed(epoch="new", ring_size=3)
    for n in range(1, 6):
        feed.publish("turn.accepted", turn_id=n)
    assert "another run" in (feed.subscribe(_sub(), after="old:2").gap or "")
    assert "older than the 3 events kept" in (feed.subscribe(_sub(), after="new:1").gap or "")
    assert feed.subscribe(_sub(), after="new:2").gap is None  # 3, 4, 5 are kept
    with pytest.raises(ValueError, match="ahead of"):
        feed.subscribe(_sub(), after="new:9")
    with pytest.raises(ValueError, match="expected '<epoch>:<seq>'"):
        feed.subscribe(_sub(), after="new")


def test_a_subscriber_that_cannot_take_an_event_is_cut_off_with_where_to_resume() -> None:
    feed = Feed(epoch="e")
    sub, got, cuts = _follow(feed, room=2)
    for n in range(1, 5):
        feed.publish("turn.accepted", turn_id=n)
    assert [e.turn_id for e in got] == [1, 2]
    assert len(cuts) == 1
    assert "after='e:2'" in cuts[0]
    assert sub.last == "e:2"
    feed.unsubscribe(sub)
    assert feed.subscribers == 0


def _sub() -> Subscriber:
    return Subscriber(EventFilter(), lambda _e, _b: True, lambda _r: None)
