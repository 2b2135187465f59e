"""`TurnWatch`: the server's one subscription to the daemon's change feed, whatever the number of
tool calls in flight, and the progress each call relays to its MCP client from it.

A tool call that runs a turn watches its turn id: the events of that turn (attempt started,
retried after a backoff, escalated, ended) reach it through a small buffer of its own, and it
sends them to the client as MCP progress notifications. Events are best effort for progress
only: a call learns that its turn settled from ``turn.wait``, never from an event, so an event
dropped (a full buffer, a resubscription) costs a progress line, never an answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.client import Client, ConnectionLost, Event, HunterError, SubscriberTooSlow
from supervisor.logging import get_logger

__all__ = ["TurnWatch", "describe", "relay_progress"]

#: the kinds a tool call reports
KINDS: Final = (
    "attempt.ended",
    "attempt.started",
    "escalation.raised",
    "escalation.resolved",
    "turn.ended",
)
#: events buffered for one watcher; more are dropped (progress only)
_BUFFER: Final = 64
#: a running turn's progress says how long it has run this often (seconds)
TICK_S: Final = 1.0
_RETRY_S: Final = 0.5

ReportProgress = Callable[[float, float | None, str | None], Awaitable[None]]


class TurnWatch:
    """One event subscription for the whole server, its events handed out by turn id."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._watchers: dict[int, list[MemoryObjectSendStream[Event]]] = {}
        self._log = get_logger("supervisor.mcp")
        #: subscriptions opened so far (1, unless the daemon restarted or cut one off)
        self.subscriptions_opened = 0
        self.events_seen = 0
        self.events_dropped = 0

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the feed until cancelled, subscribing again (after the last cursor) when the
        daemon cuts the subscription off or restarts."""
        after: str | None = None
        started = False
        while True:
            try:
                async with self._client.events(kinds=KINDS, after=after) as events:
                    self.subscriptions_opened += 1
                    if not started:
                        started = True
                        task_status.started()
                    while True:
                        for event in await events.batch():
                            self.events_seen += 1
                            self._deliver(event)
                        after = events.last
            except (ConnectionLost, SubscriberTooSlow) as exc:
                self._log.info("mcp_events_resubscribing", reason=type(exc).__name__)
            except HunterError as exc:
                self._log.warning("mcp_events_refused", code=exc.code, message=exc.message)
                after = None
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(_RETRY_S)
            try:
                await self._client.reconnect_if_lost()
            except (ConnectionLost, HunterError, OSError) as exc:
                self._log.warning("mcp_daemon_unreachable", error=str(exc))

    def _deliver(self, event: Event) -> None:
        if event.turn_id is None:
            return
        for send in self._watchers.get(event.turn_id, ()):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                self.events_dropped += 1

    @contextmanager
    def watch(self, turn_id: int) -> Iterator[MemoryObjectReceiveStream[Event]]:
        """The events of *turn_id* while the block runs."""
        send, receive = anyio.create_memory_object_stream[Event](_BUFFER)
        self._watchers.setdefault(turn_id, []).append(send)
        try:
            with receive:
                yield receive
        finally:
            senders = self._watchers.get(turn_id, [])
            if send in senders:
                senders.remove(send)
            if not senders:
                self._watchers.pop(turn_id, None)
            send.close()

    def statistics(self) -> dict[str, int]:
        return {
            "subscriptions_opened": self.subscriptions_opened,
            "turns_watched": len(self._watchers),
            "events_seen": self.events_seen,
            "events_dropped": self.events_dropped,
        }


def describe(event: Event) -> str | None:
    """An event as one progress line; None for one not worth a line."""
    turn = f"turn {event.turn_id}"
    if event.kind == "attempt.started":
        return f"{turn}: attempt {event.attempt} started"
    if event.kind == "attempt.ended":
        if event.decision == "RETRY":
            return (
                f"{turn}: attempt {event.attempt} failed ({event.reason_code}); retry after backoff"
            )
        return f"{turn}: attempt {event.attempt} ended: {event.decision} ({event.reason_code})"
    if event.kind == "escalation.raised":
        return (
            f"{turn}: escalated ({event.reason_code}): waiting for an operator"
            " (hunter escalations, or the console)"
        )
    if event.kind == "escalation.resolved":
        return f"{turn}: an operator resolved it: {event.decision}"
    if event.kind == "turn.ended":
        return f"{turn}: ended {event.state} ({event.reason_code})"
    return None


async def relay_progress(
    receive: MemoryObjectReceiveStream[Event], report: ReportProgress, first: str
) -> None:
    """Report *first*, then each event's line, and how long the turn has run every `TICK_S`,
    until cancelled (the caller cancels once the turn settled)."""
    step = 1
    await report(step, None, first)
    started = anyio.current_time()
    while True:
        with anyio.move_on_after(TICK_S):
            event = await receive.receive()
            line = describe(event)
            if line is not None:
                step += 1
                await report(step, None, line)
            continue
        step += 1
        await report(step, None, f"still running after {anyio.current_time() - started:.0f} s")
