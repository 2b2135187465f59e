"""The console's one view of the daemon's changes, fanned out to every browser.

The console holds one subscription to the daemon's event stream (`DaemonLink`); each event is
handed to every browser's stream (`LiveFeed.publish`) without waiting: a browser that does not
keep up has its stream closed (its page reconnects and re-reads), so neither the console nor
the daemon is ever slowed by a browser, and a browser holds at most `BROWSER_BUFFER` events.
However many browsers are open, the daemon sees one subscriber.

`LiveFeed` also keeps what the overview draws: turns ended per 5-second bucket and their
latency (accepted to ended, from the events' own times) over the last ten minutes, and the
last endings. Times come in with the events; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.client import Client, ConnectionLost, DaemonNotRunning, HunterError
from supervisor.feed import Event
from supervisor.logging import get_logger

__all__ = ["BROWSER_BUFFER", "Bucket", "DaemonLink", "LiveFeed", "TooManyStreams"]

#: events a browser's stream may hold unread before it is closed
BROWSER_BUFFER: Final = 256
#: browser streams open at once, all sign-ins together (each costs a little memory)
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


@dataclass(slots=True, eq=False)  # hashed by identity: one per browser stream
class _Listener:
    send: MemoryObjectSendStream[Event]
    wants: Callable[[Event], bool]


@dataclass(slots=True)
class LiveFeed:
    """Browsers' streams and the overview's figures, fed by `publish`."""

    _listeners: set[_Listener] = field(default_factory=set)
    _accepted_us: OrderedDict[int, int] = field(default_factory=OrderedDict)
    _buckets: deque[Bucket] = field(default_factory=lambda: deque(maxlen=BUCKETS))
    recent: deque[Event] = field(default_factory=lambda: deque(maxlen=_RECENT_KEPT))
    published: int = 0
    dropped_streams: int = 0
    #: the newest event's cursor (the link resumes from it after a reconnect)
    cursor: str | None = None

    @property
    def streams(self) -> int:
        return len(self._listeners)

    def publish(self, event: Event) -> None:
        """Count *event* and hand it to every browser that wants it (never waits)."""
        self.published += 1
        if event.cursor:
            self.cursor = event.cursor
        self._count(event)
        for listener in list(self._listeners):
            if not listener.wants(event):
                continue
            try:
                listener.send.send_nowait(event)
            except anyio.WouldBlock:  # a browser that does not keep up: it reconnects
                self._drop(listener)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._drop(listener)

    def _drop(self, listener: _Listener) -> None:
        self._listeners.discard(listener)
        listener.send.close()
        self.dropped_streams += 1

    @asynccontextmanager
    async def listen(
        self, wants: Callable[[Event], bool]
    ) -> AsyncIterator[MemoryObjectReceiveStream[Event]]:
        """A browser's stream of the events *wants* accepts, for the block; it ends early when
        the browser falls `BROWSER_BUFFER` events behind."""
        if len(self._listeners) >= MAX_STREAMS:
            raise TooManyStreams(f"{MAX_STREAMS} live streams are open; try again later")
        send, receive = anyio.create_memory_object_stream[Event](BROWSER_BUFFER)
        listener = _Listener(send, wants)
        self._listeners.add(listener)
        try:
            with receive:
                yield receive
        finally:
            self._listeners.discard(listener)
            send.close()

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
        self.connected = anyio.Event()
        self._log = get_logger("hunter.console")

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
                    self.connected.set()
                    self._log.info("console_linked", socket=self.socket, gap=events.gap)
                    if events.gap is not None:
                        self.feed.publish(_resync(events.gap))
                    async for event in events:
                        self.feed.publish(event)
            except (DaemonNotRunning, ConnectionLost, HunterError, OSError) as exc:
                was = self.client is not None
                self.client, self.problem = None, f"the daemon at {self.socket}: {exc}"
                self.connected = anyio.Event()
                if was:
                    self._log.warning("console_unlinked", socket=self.socket, error=str(exc))
                    self.feed.publish(_resync("the daemon's connection was lost"))
            self.client = None
            await anyio.sleep(self.RETRY_S)


def _resync(why: str) -> Event:
    """A console-made event telling the pages to re-read: events may have been missed."""
    return Event(seq=0, kind="console.resync", at_us=0, cursor="", detail=why)
