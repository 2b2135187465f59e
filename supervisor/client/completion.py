"""Following the change feed from a `Client`: `Events` (a subscription's events, typed) and
`Completion` (turns as they settle, over one subscription: `Client.as_completed`,
`Client.wait`). Both are made by the client; nothing here opens a connection of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Protocol

import anyio
import msgspec

from supervisor.client.errors import SubscriberTooSlow, error_for
from supervisor.client.models import SETTLED_STATES, Turn
from supervisor.errors import ConnectionLost, ControlClientError
from supervisor.feed import Event

if TYPE_CHECKING:
    from supervisor.control.client import Subscription

__all__ = ["Completion", "Events", "TurnSource"]


class TurnSource(Protocol):
    """What `Completion` needs of the `Client` that made it (which imports this module)."""

    def events(self, *, turns: Iterable[int] | None = None) -> AbstractAsyncContextManager[Events]:
        """A subscription to the change feed, for these turns."""
        ...

    async def get_turn(self, turn_id: int) -> Turn:
        """The turn as it is now."""
        ...

    async def reconnect_if_lost(self) -> None:
        """Open a new connection if this one dropped."""
        ...


class Completion:
    """`Client.as_completed`: an async context manager holding the subscription, and an async
    iterator of the turns as they settle. A subscription the daemon cuts off or a connection
    that drops is taken up again, and the turns still awaited are read again: nothing is
    missed."""

    def __init__(
        self, client: TurnSource, turn_ids: Iterable[int], timeout_s: float | None
    ) -> None:
        self._client = client
        self._waiting = set(turn_ids)
        self._ready: list[Turn] = []
        self._deadline = anyio.current_time() + timeout_s if timeout_s is not None else float("inf")
        self._stack: AsyncExitStack | None = None
        self._events: Events | None = None

    async def __aenter__(self) -> Completion:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        stack, self._stack, self._events = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def _follow(self) -> Events:
        """The subscription, opened (again) if need be; then the awaited turns are read, so
        that one that settled before it is not missed."""
        if self._events is not None:
            return self._events
        stack = AsyncExitStack()
        events = await stack.enter_async_context(self._client.events(turns=self._waiting))
        self._stack, self._events = stack, events
        for turn_id in sorted(self._waiting):
            turn = await self._client.get_turn(turn_id)
            if turn.settled:
                self._waiting.discard(turn_id)
                self._ready.append(turn)
        return events

    def __aiter__(self) -> Completion:
        return self

    async def __anext__(self) -> Turn:
        with anyio.fail_after(max(0.0, self._deadline - anyio.current_time())):
            while not self._ready:
                if not self._waiting:
                    await self._close()
                    raise StopAsyncIteration
                try:
                    events = await self._follow()
                    if self._ready:
                        break
                    event = await events.__anext__()
                except (ConnectionLost, SubscriberTooSlow):
                    await self._close()
                    await self._client.reconnect_if_lost()
                    continue
                if event.turn_id in self._waiting and event.state in SETTLED_STATES:
                    self._waiting.discard(event.turn_id)
                    self._ready.append(await self._client.get_turn(event.turn_id))
            return self._ready.pop(0)


class Events:
    """A subscription's events, typed (`supervisor.feed.Event`). Iteration ends with
    `SubscriberTooSlow` when the daemon cut the subscription off (subscribe again with
    ``after=last``) and `ConnectionLost` when the connection ends."""

    __slots__ = ("_subscription",)

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    @property
    def gap(self) -> str | None:
        """Why the cursor given could not be honoured (the daemon restarted, or it was too
        old): re-read what you follow. None: nothing was missed."""
        gap = self._subscription.ack.get("gap")
        return str(gap) if gap else None

    @property
    def last(self) -> str:
        """The cursor to resume from without losing or repeating an event."""
        return self._subscription.last

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> Event:
        try:
            event = await self._subscription.__anext__()
        except ControlClientError as exc:
            raise error_for(exc) from None
        return msgspec.convert(event, Event)

    async def batch(self) -> list[Event]:
        """Every event that has arrived, at least one (waiting for it), oldest first: a reader
        of a busy daemon wakes once per burst instead of once per event. It ends as iteration
        does (an error that followed some events is raised at the next call)."""
        try:
            events = await self._subscription.batch()
        except ControlClientError as exc:
            raise error_for(exc) from None
        return msgspec.convert(events, list[Event])
