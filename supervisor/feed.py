"""The daemon's change feed: what happened to turns, escalations, executors and daemons, in
order, for subscribers that want to be told instead of asking (``events.subscribe`` on
``control.sock``; the client library's iterator, ``hunter events``, ``turn wait``, the console).

* **Events** are small frozen records (`Event`): a daemon-wide sequence number, a kind
  (`KINDS`), when, and the ids and outcome fields that kind has (a turn's session, id, state,
  attempt, decision, reason code; an executor's id and command types; a daemon's owner id).
  They say *that* something changed and to what; a subscriber that wants a turn's whole record
  reads it (``turn.get``).
* **Publishing costs the hot path almost nothing**: an event is built and appended to a ring
  of the most recent ones (`Feed.ring_size`); only subscribers whose filter names the event's
  turn or session, or who take every event, are looked at, and the event is encoded once for
  all of them.
* **Delivery is pushed, never awaited**: each subscriber is a callback (`Subscriber.deliver`)
  that hands the encoded event to its connection's writer without waiting (`FrameWriter.
  send_nowait`). A subscriber whose writer is already holding its limit (the client stopped
  reading) is cut off at once with a reason (`Subscriber.cut`): it never slows the daemon and
  its memory is bounded by that limit.
* **Resuming**: each event's ``cursor`` is ``"<epoch>:<seq>"`` (the epoch names this run of the
  daemon). A subscriber that reconnects with ``after`` set to the last cursor it saw gets every
  later event still in the ring, then the live ones, with nothing lost or repeated. When the
  cursor is of another run of the daemon (it restarted) or older than the ring holds, the
  subscription says ``gap``: the client re-reads the state it cares about (``turn.get``,
  ``turns.list``), which the store keeps across restarts, then follows the live events.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, TypeVar

import msgspec

__all__ = [
    "KINDS",
    "Event",
    "EventFilter",
    "Feed",
    "Replay",
    "Subscriber",
]

#: Every kind of event, and what it means.
KINDS: Final = {
    "turn.accepted": "a turn was accepted (it is durable)",
    "attempt.started": "an attempt of a turn was sent to an executor or started in the sandbox",
    "attempt.ended": "an attempt got its outcome and decision (RETRY, or the one that ends it)",
    "turn.ended": "a turn reached a final state (succeeded, failed, terminated, cancelled)",
    "escalation.raised": "a turn was parked for an operator's decision",
    "escalation.resolved": "an operator resolved an escalated turn (retry or terminate)",
    "executor.connected": "an executor connected and was registered",
    "executor.quarantined": "an executor broke the protocol and its id is refused for a while",
    "executor.gone": "an executor disconnected or was dropped",
    "daemon.joined": "a daemon of the fleet began heartbeating",
    "daemon.lost": "a daemon of the fleet stopped heartbeating for longer than its lease",
}

#: Events the ring keeps for subscribers that resume.
DEFAULT_RING_SIZE: Final = 16_384


class Event(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One change. Fields a kind does not have are left out of its encoding."""

    seq: int
    kind: str
    at_us: int
    cursor: str
    session_id: str | None = None
    turn_id: int | None = None
    state: str | None = None
    attempt: int | None = None
    decision: str | None = None
    reason_code: str | None = None
    executor_id: str | None = None
    command_types: tuple[str, ...] = ()
    daemon: str | None = None
    detail: str | None = None


_ENCODER: Final = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a subscriber wants: of these sessions, turns, kinds (None: any). An event
    passes when it matches every filter given; events without a session or turn (executors,
    daemons) pass a session or turn filter only when none is given."""

    sessions: frozenset[str] | None = None
    turns: frozenset[int] | None = None
    kinds: frozenset[str] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds or ()) - KINDS.keys())
        if unknown:
            msg = f"unknown event kinds {unknown}; the kinds are {sorted(KINDS)}"
            raise ValueError(msg)

    def matches(self, event: Event) -> bool:
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if self.sessions is not None and event.session_id not in self.sessions:
            return False
        return self.turns is None or event.turn_id in self.turns


class Subscriber:
    """One subscription: its filter, and where its events go.

    *deliver* takes the event and its encoded body (shared by every subscriber of that event)
    and returns False when it could not take it without waiting: the subscriber is then cut
    off (`cut`, with the reason) and hears nothing more; *on_cut* is told once. ``last`` is
    the cursor after which a new subscription resumes without losing or repeating an event
    (the last one delivered, or where the subscription began)."""

    __slots__ = ("_deliver", "_on_cut", "cut", "delivered", "filter", "last")

    def __init__(
        self,
        event_filter: EventFilter,
        deliver: Callable[[Event, bytes], bool],
        on_cut: Callable[[str], None],
    ) -> None:
        self.filter = event_filter
        self._deliver = deliver
        self._on_cut = on_cut
        self.cut: str | None = None
        self.delivered = 0
        self.last = ""

    def offer(self, event: Event, body: bytes) -> None:
        if self.cut is not None or not self.filter.matches(event):
            return
        if self._deliver(event, body):
            self.delivered += 1
            self.last = event.cursor
            return
        self.cut = (
            f"too slow: the client stopped reading (the connection's buffer is full) after"
            f" {self.delivered} events; subscribe again with after={self.last!r} to go on"
            " without losing an event"
        )
        self._on_cut(self.cut)


@dataclass(frozen=True, slots=True)
class Replay:
    """What a new subscription gets before the live events: the ring's events after its
    cursor that pass its filter, or a gap (the cursor is of another run, or too old)."""

    events: tuple[Event, ...]
    gap: str | None
    cursor: str


@dataclass(slots=True)
class _Index:
    """Subscribers by what they filter on, so that an event looks only at those it may concern."""

    everything: list[Subscriber] = field(default_factory=list)
    by_session: dict[str, list[Subscriber]] = field(default_factory=dict)
    by_turn: dict[int, list[Subscriber]] = field(default_factory=dict)

    def add(self, sub: Subscriber) -> None:
        f = sub.filter
        if f.turns is not None:
            for turn_id in f.turns:
                self.by_turn.setdefault(turn_id, []).append(sub)
        elif f.sessions is not None:
            for session_id in f.sessions:
                self.by_session.setdefault(session_id, []).append(sub)
        else:
            self.everything.append(sub)

    def remove(self, sub: Subscriber) -> None:
        f = sub.filter
        if f.turns is not None:
            for turn_id in f.turns:
                _drop(self.by_turn, turn_id, sub)
        elif f.sessions is not None:
            for session_id in f.sessions:
                _drop(self.by_session, session_id, sub)
        elif sub in self.everything:
            self.everything.remove(sub)

    def concerned(self, event: Event) -> Iterator[Subscriber]:
        yield from self.everything
        if event.session_id is not None:
            yield from self.by_session.get(event.session_id, ())
        if event.turn_id is not None:
            yield from self.by_turn.get(event.turn_id, ())

    def __len__(self) -> int:
        return (
            len(self.everything)
            + sum(map(len, self.by_session.values()))
            + sum(map(len, self.by_turn.values()))
        )


K = TypeVar("K")


def _drop(table: dict[K, list[Subscriber]], key: K, sub: Subscriber) -> None:
    subs = table.get(key)
    if subs is None:
        return
    if sub in subs:
        subs.remove(sub)
    if not subs:
        del table[key]


class Feed:
    """The daemon's change feed: a ring of recent events and the live subscribers."""

    def __init__(
        self,
        *,
        ring_size: int = DEFAULT_RING_SIZE,
        epoch: str | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.epoch = epoch or secrets.token_hex(4)
        self.ring_size = ring_size
        self._ring: collections.deque[Event] = collections.deque(maxlen=ring_size)
        self._seq = 0
        self._clock = clock
        self._subs = _Index()
        self.published = 0
        self.cut_off = 0

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self,
        kind: str,
        *,
        session_id: str | None = None,
        turn_id: int | None = None,
        state: str | None = None,
        attempt: int | None = None,
        decision: str | None = None,
        reason_code: str | None = None,
        executor_id: str | None = None,
        command_types: tuple[str, ...] = (),
        daemon: str | None = None,
        detail: str | None = None,
    ) -> Event:
        """Record one change and push it to the subscribers it concerns."""
        self._seq = seq = self._seq + 1
        event = Event(
            seq,
            kind,
            self._clock(),
            f"{self.epoch}:{seq}",
            session_id,
            turn_id,
            state,
            attempt,
            decision,
            reason_code,
            executor_id,
            command_types,
            daemon,
            detail,
        )
        self._ring.append(event)
        self.published += 1
        subs = self._subs
        if subs.everything or subs.by_session or subs.by_turn:
            body: bytes | None = None
            for sub in list(subs.concerned(event)):
                if body is None:
                    body = _ENCODER.encode(event)
                sub.offer(event, body)
        return event

    # -- subscribing --------------------------------------------------------------------------

    def subscribe(self, sub: Subscriber, *, after: str | None = None) -> Replay:
        """Add *sub*; what it gets first (see `Replay`). The replay is taken and the
        subscriber added in one step (no await between), so no event falls between them."""
        replay = self._replay(sub.filter, after)
        sub.last = after if after is not None and replay.gap is None else replay.cursor
        self._subs.add(sub)
        return replay

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subs.remove(sub)

    def encode(self, event: Event) -> bytes:
        return _ENCODER.encode(event)

    @property
    def cursor(self) -> str:
        """The cursor of the newest event (``"<epoch>:0"`` before the first)."""
        return f"{self.epoch}:{self._seq}"

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def recent(self) -> Iterable[Event]:
        return tuple(self._ring)

    def _replay(self, event_filter: EventFilter, after: str | None) -> Replay:
        if after is None:
            return Replay((), None, self.cursor)
        epoch, _, seq_text = after.partition(":")
        if not seq_text.isdigit():
            msg = f"bad cursor {after!r}: expected '<epoch>:<seq>' as an event's cursor field"
            raise ValueError(msg)
        seq = int(seq_text)
        if epoch != self.epoch:
            gap = (
                f"cursor {after!r} is of another run of the daemon (it restarted; this run is"
                f" {self.epoch!r}): re-read the turns you follow, then follow these events"
            )
            return Replay((), gap, self.cursor)
        if seq > self._seq:
            msg = f"cursor {after!r} is ahead of this daemon's newest event ({self.cursor})"
            raise ValueError(msg)
        oldest = self._ring[0].seq if self._ring else self._seq + 1
        if seq + 1 < oldest:
            gap = (
                f"cursor {after!r} is older than the {len(self._ring)} events kept (the oldest"
                f" is {self.epoch}:{oldest}): re-read the turns you follow, then follow these"
                " events"
            )
            return Replay((), gap, self.cursor)
        start = seq + 1 - oldest  # index of the first event after the cursor
        events = tuple(
            e for i, e in enumerate(self._ring) if i >= start and event_filter.matches(e)
        )
        return Replay(events, None, self.cursor)
