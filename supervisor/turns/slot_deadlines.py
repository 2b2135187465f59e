"""When parked turns start even without a free executor slot: each turn's own bound.

A parked instruction turn may wait for a slot at most ``executors.queue_wait_s``, and never
longer than its own ``timeout_ms`` (`instruction.slot_wait_s`): a one-second instruction is not
parked for a minute. Bounds differ per turn, so the arrival order of the parked queues does not
give the order in which they fall due; this heap does. Entries of turns that started or ended
meanwhile are skipped by the caller (it asks the parked queues whether the turn is still
there), so nothing has to be removed from here.

Pure bookkeeping: no I/O, no clock reads (the caller passes ``now``).
"""

from __future__ import annotations

import heapq

__all__ = ["SlotDeadlines"]


class SlotDeadlines:
    """A min-heap of (due time, turn id); O(log n) per turn."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, turn_id: int, due_at: float) -> None:
        """Turn *turn_id* starts at *due_at* at the latest (an infinite bound is not kept)."""
        if due_at != float("inf"):
            heapq.heappush(self._heap, (due_at, turn_id))

    def due(self, now: float) -> list[int]:
        """Take the ids of every turn due at *now* or before, earliest first."""
        heap = self._heap
        taken: list[int] = []
        while heap and heap[0][0] <= now:
            taken.append(heapq.heappop(heap)[1])
        return taken

    def clear(self) -> None:
        """Forget every entry (nothing is parked any more)."""
        self._heap.clear()
