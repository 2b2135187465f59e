"""The console's one view of the daemon's changes, fanned out to every browser.

The console holds one subscription to the daemon's event stream (`DaemonLink`). A browser does
not need every event: a page needs to know that what it shows changed, so that it re-reads
itself. Browsers are grouped by what their page follows (everything, one turn, one session:
a `Follow`); each event bumps the generation of the groups it concerns (at most three), and
each browser's stream sends one message when the generation it last saw is behind, at most
`MESSAGES_PER_S` a second (`supervisor.console.stream`). So an event costs the console the
same whether one browser or a thousand are open, a browser costs a few messages a second
whatever the daemon's rate, and a browser that stops reading holds nothing but its counter;
the daemon sees one subscriber.

`LiveFeed` also keeps what the overview draws: turns ended per 5-second bucket and their
latency (accepted to ended, from the events' own times) over the last ten minutes, and the
last endings. Times come in with the events; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.abc

from supervisor.client import Client, ConnectionLost, DaemonNotRunning, HunterError
from supervisor.feed import Event
from supervisor.logging import get_logger

__all__ = [
    "BUCKET_S",
    "MAX_STREAMS",
    "Bucket",
    "DaemonLink",
    "Follow",
    "LiveFeed",
    "TooManyStreams",
]

#: browser streams open at once, all sign-ins together
MAX_STREAMS: Final = 1000
#: the overview's chart: buckets of this many seconds, this many of them
BUCKET_S: Final = 5
BUCKETS: Final = 120
#: accepted turns remembered for their latency at the end (the oldest forgotten first)
_ACCEPTED_KEPT: Final = 100_000
#: latency samples kept per bucket (enough for its p50 and p95)
_SAMPLES_KEPT: Final = 2000
#: a turn's ending stays in the overview's list of recent endings
_RECENT_KEPT: Final = 20
_RESYNC: Final = "console.resync"


class TooManyStreams(Exception):
    """Raised by `LiveFeed.listen` when `MAX_STREAMS` browser streams are open."""


@dataclass(slots=True)
class Bucket:
    """The turns that ended in one `BUCKET_S` window."""

    start_s: int
    ended: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def percentile(self, fraction: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, math.floor(fraction * len(ordered)))]


@dataclass(slots=True, eq=False)
class Follow:
    """What the pages of one kind follow (everything, a turn, a session): a generation that
    grows by one per change, and the last change's cursor and kind. Streams wait for
    `changed` and compare generations."""

    generation: int = 0
    cursor: str = ""
    kind: str = ""
    listeners: int = 0
    #: set and replaced at a change while streams wait on it (None: nobody waits)
    changed: anyio.Event | None = None

    def bump(self, event: Event) -> None:
        self.generation += 1
        self.cursor, self.kind = event.cursor, event.kind
        if self.changed is not None:  # only when a stream waits: no churn on a busy daemon
            self.changed.set()
            self.changed = None

    async def wait_past(self, seen: int) -> None:
        """Return once the generation is past *seen*."""
        while self.generation == seen:
            if self.changed is None:
                self.changed = anyio.Event()
            await self.changed.wait()


@dataclass(slots=True)
class LiveFeed:
    """The groups browsers follow and the overview's figures, fed by `publish`."""

    everything: Follow = field(default_factory=Follow)
    _turns: dict[int, Follow] = field(default_factory=dict)
    _sessions: dict[str, Follow] = field(default_factory=dict)
    _accepted_us: OrderedDict[int, int] = field(default_factory=OrderedDict)
    _buckets: deque[Bucket] = field(default_factory=lambda: deque(maxlen=BUCKETS))
    recent: deque[Event] = field(default_factory=lambda: deque(maxlen=_RECENT_KEPT))
    streams: int = 0
    #: the newest event's cursor (the link resumes from it after a reconnect)
    cursor: str | None = None

    def publish(self, event: Event) -> None:
        """Count *event* and mark the groups it concerns changed (never waits)."""
        if event.kind == _RESYNC:  # events may have been missed: every page re-reads
            for follow in (self.everything, *self._turns.values(), *self._sessions.values()):
                follow.bump(event)
            return
        self.cursor = event.cursor
        self._count(event)
        self.everything.bump(event)
        if event.turn_id is not None:
            turn = self._turns.get(event.turn_id)
            if turn is not None:
                turn.bump(event)
        if event.session_id is not None:
            session = self._sessions.get(event.session_id)
            if session is not None:
                session.bump(event)

    @asynccontextmanager
    async def listen(
        self, *, turn: int | None = None, session: str | None = None
    ) -> AsyncIterator[Follow]:
        """The group a browser's page follows (one turn, one session, or everything), for the
        block."""
        if self.streams >= MAX_STREAMS:
            raise TooManyStreams(f"{MAX_STREAMS} live streams are open; try again later")
        if turn is not None:
            follow = self._turns.setdefault(turn, Follow())
        elif session is not None:
            follow = self._sessions.setdefault(session, Follow())
        else:
            follow = self.everything
        follow.listeners += 1
        self.streams += 1
        try:
            yield follow
        finally:
            follow.listeners -= 1
            self.streams -= 1
            if follow.listeners == 0:  # the last page of that turn or session closed
                if turn is not None:
                    self._turns.pop(turn, None)
                elif session is not None:
                    self._sessions.pop(session, None)

    # -- the overview's figures ------------------------------------------------------------

    def _count(self, event: Event) -> None:
        if event.kind == "turn.accepted" and event.turn_id is not None:
            self._accepted_us[event.turn_id] = event.at_us
            if len(self._accepted_us) > _ACCEPTED_KEPT:
                self._accepted_us.popitem(last=False)
        elif event.kind == "turn.ended" and event.turn_id is not None:
            self.recent.appendleft(event)
            bucket = self._bucket(event.at_us // 1_000_000)
            bucket.ended += 1
            accepted = self._accepted_us.pop(event.turn_id, None)
            if accepted is not None and len(bucket.latencies_ms) < _SAMPLES_KEPT:
                bucket.latencies_ms.append((event.at_us - accepted) / 1000)

    def _bucket(self, at_s: int) -> Bucket:
        start = at_s - at_s % BUCKET_S
        if self._buckets and self._buckets[-1].start_s == start:
            return self._buckets[-1]
        if self._buckets and self._buckets[-1].start_s > start:  # late: into its own bucket
            for bucket in reversed(self._buckets):
                if bucket.start_s == start:
                    return bucket
            return Bucket(start)  # older than the chart: counted nowhere
        bucket = Bucket(start)
        self._buckets.append(bucket)
        return bucket

    def buckets(self, now_s: float) -> list[Bucket]:
        """The last `BUCKETS` windows up to *now_s*, oldest first, empty ones included."""
        last = int(now_s) - int(now_s) % BUCKET_S
        have = {b.start_s: b for b in self._buckets}
        first = last - (BUCKETS - 1) * BUCKET_S
        return [have.get(s, Bucket(s)) for s in range(first, last + 1, BUCKET_S)]


class DaemonLink:
    """The console's connection to the daemon: a library `Client`, connected (again) in the
    background, and the one subscription that feeds `LiveFeed`. While the daemon cannot be
    reached, ``client`` is None and ``problem`` says why; pages say so and the link retries
    every `RETRY_S`."""

    RETRY_S: Final = 1.0

    def __init__(self, socket: anyio.Path | str, feed: LiveFeed) -> None:
        self.socket = str(socket)
        self.feed = feed
        self.client: Client | None = None
        self.problem: str | None = "connecting"
        self._log = get_logger("supervisor.console")

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep connected and subscribed until cancelled; *task_status* is started at once."""
        from pathlib import Path

        task_status.started()
        while True:
            try:
                async with (
                    Client(Path(self.socket), reconnect_s=0) as client,
                    client.events(after=self.feed.cursor) as events,
                ):
                    self.client, self.problem = client, None
                    self._log.info("console_linked", socket=self.socket, gap=events.gap)
                    if events.gap is not None:
                        self.feed.publish(_resync(events.gap))
                    while True:  # a burst of events: one wake-up
                        for event in await events.batch():
                            self.feed.publish(event)
            except (DaemonNotRunning, ConnectionLost, HunterError, OSError) as exc:
                was = self.client is not None
                self.client, self.problem = None, f"the daemon at {self.socket}: {exc}"
                if was:
                    self._log.warning("console_unlinked", socket=self.socket, error=str(exc))
                    self.feed.publish(_resync("the daemon's connection was lost"))
            self.client = None
            await anyio.sleep(self.RETRY_S)


def _resync(why: str) -> Event:
    """A console-made event telling the pages to re-read: events may have been missed."""
    return Event(seq=0, kind=_RESYNC, at_us=0, cursor="", detail=why)
