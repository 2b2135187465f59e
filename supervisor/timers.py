"""Callbacks due at a time, served by one task: the deadlines of many waits without a cancel
scope each (the control server's submit-and-wait answers).

`Timers.call_at` files a callback under a deadline (`time.monotonic`, the clock of asyncio's
event loop: `anyio.current_time` costs a backend lookup per call) and returns a key;
`cancel` forgets it (the usual case: the wait ended first). One task (`run`) sleeps until the
earliest deadline and calls what is due. Cancelled entries are skipped when they come up, and
the heap is rebuilt without them once they outnumber the live ones, so a million waits that
ended early cost nothing after a while.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

import anyio

__all__ = ["Timers"]


class Timers:
    """Deadlines and their callbacks; `run` calls each one once it is due (unless cancelled)."""

    __slots__ = ("_heap", "_live", "_seq", "_wake")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, Callable[[], None]] = {}
        self._seq = itertools.count(1)
        self._wake: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._live)

    def call_at(self, deadline: float, fire: Callable[[], None]) -> int:
        """Call *fire* at *deadline* (`time.monotonic`); the key for `cancel`."""
        key = next(self._seq)
        heap = self._heap
        if len(heap) > 2 * len(self._live) + 1024:  # mostly cancelled entries: drop them
            heap[:] = [(d, k) for d, k in heap if k in self._live]
            heapq.heapify(heap)
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (deadline, key))
        self._live[key] = fire
        if self._wake is not None and (earliest is None or deadline < earliest):
            self._wake.set()
        return key

    def cancel(self, key: int) -> None:
        """Forget the callback of *key* (nothing happens if it ran or was cancelled)."""
        self._live.pop(key, None)

    async def run(self) -> None:
        """Call the callbacks as they fall due, until cancelled."""
        heap = self._heap
        while True:
            wake = self._wake = anyio.Event()
            if heap:
                with anyio.move_on_after(max(0.0, heap[0][0] - time.monotonic())):
                    await wake.wait()
            else:
                await wake.wait()
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                _, key = heapq.heappop(heap)
                fire = self._live.pop(key, None)
                if fire is not None:
                    fire()
