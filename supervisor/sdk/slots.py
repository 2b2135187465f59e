"""The executor's slots: queued instructions run on at most ``limit`` long-lived worker tasks.

No task per instruction, and no wake-up per instruction either. The ``limit`` workers start
with the connection. ``put`` queues an item and makes sure one worker is on its way (an idle one
woken). A worker runs the queued items one after the other in one stretch. It steps each item's
coroutine itself: when the coroutine finishes without waiting (a handler that computes its
answer at once), the next item follows at once; when it waits (I/O, a sleep), the stretch is
over: ``paused`` is called (the connection writes the answers of the stretch), another worker is
woken for the items still queued, and this one stays with its item until it is done. So a
handler that waits never holds up the items behind it while a slot is free, and a batch of
handlers that do not wait costs one wake-up, not one per item. At most ``limit`` items run at
once: the executor's ``slots``.

Stepping the coroutine (``_resume``) is what ``await`` does, done by hand: whatever it yields
goes to the event loop unchanged and whatever the loop sends or throws goes back into it, all
in the worker's own task, so cancel scopes and context variables behave as in a plain ``await``.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["Slots"]

T = TypeVar("T")


class Slots(Generic[T]):
    """Runs ``run(item)`` for each item ``put``, at most ``limit`` at once, on workers started
    in ``task_group`` (they end with it); ``paused()`` after each stretch of a worker (see the
    module docs)."""

    __slots__ = ("_idle", "_paused", "_queue", "_run", "_waking")

    def __init__(
        self,
        task_group: anyio.abc.TaskGroup,
        limit: int,
        run: Callable[[T], Coroutine[Any, Any, None]],
        *,
        paused: Callable[[], None] = lambda: None,
    ) -> None:
        if limit < 1:
            msg = f"limit must be at least 1, got {limit}"
            raise ValueError(msg)
        self._run = run
        self._paused = paused
        self._queue: deque[T] = deque()
        self._idle: list[anyio.Event] = []
        self._waking = limit  # workers woken or started that have not looked at the queue yet
        for _ in range(limit):
            task_group.start_soon(self._worker)

    @property
    def queued(self) -> int:
        """Items waiting for a worker."""
        return len(self._queue)

    def put(self, item: T) -> None:
        """Queue ``item``; a worker runs it as soon as one is free."""
        self._queue.append(item)
        self._wake()

    def _wake(self) -> None:
        if self._waking:
            return  # one is on its way: it takes the next item
        if self._idle:
            self._waking += 1
            self._idle.pop().set()

    async def _worker(self) -> None:
        queue = self._queue
        run = self._run
        new_event = type(anyio.Event())  # the backend's class: no lookup per idle spell
        while True:
            self._waking -= 1
            while queue:
                coro = run(queue.popleft())
                try:
                    yielded = coro.send(None)
                except StopIteration:
                    continue  # done without waiting: on with the next one
                self._paused()
                if queue:
                    self._wake()  # someone takes the next one while this one waits
                await _resume(coro, yielded)
            self._paused()
            event = new_event()
            self._idle.append(event)
            await event.wait()


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], yielded: object) -> Generator[Any, Any, None]:
    """Go on with *coro*, which has just yielded *yielded* to the event loop (see the module
    docs)."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # cancellation and the like: *coro* decides
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return
