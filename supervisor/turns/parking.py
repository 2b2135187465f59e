"""Parked turns: accepted instruction turns that wait for an executor slot without a task.

A turn that waited inside the executor hub held a task and its whole coroutine stack (about
13 KB in the core, 20 KB with the hub's queue entry): 100,000 queued turns were 2 GB. A turn
whose command type has no free executor slot when it is accepted is *parked* here instead: a
small record (the turn, its claim, when it was parked), in FIFO order per command type. It
stays ``accepted`` in the store (no attempt has started) and keeps its claim (renewed with the
others). The core starts parked turns, oldest first, as slots free up; a turn parked longer than
the hub's queue wait starts anyway, so that it meets the hub's usual "no executor" timeout.

Pure bookkeeping: no I/O, no tasks; the core decides when to look.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.store.protocol import Claim, TurnRecord

__all__ = ["Parked", "ParkedTurns"]


@dataclass(frozen=True, slots=True)
class Parked:
    turn: TurnRecord
    claim: Claim
    parked_at: float


class ParkedTurns:
    """FIFO queues of parked turns, one per command type."""

    def __init__(self) -> None:
        self._queues: dict[ExecutorCommandType, collections.OrderedDict[int, Parked]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def count(self, command: ExecutorCommandType) -> int:
        queue = self._queues.get(command)
        return 0 if queue is None else len(queue)

    def park(
        self, command: ExecutorCommandType, turn: TurnRecord, claim: Claim, now: float
    ) -> None:
        queue = self._queues.setdefault(command, collections.OrderedDict())
        queue[turn.turn_id] = Parked(turn, claim, now)
        self._count += 1

    def remove(self, turn_id: int) -> Parked | None:
        """Take one turn out (a cancel, a lost claim); None when it is not parked."""
        for queue in self._queues.values():
            parked = queue.pop(turn_id, None)
            if parked is not None:
                self._count -= 1
                return parked
        return None

    def pop(self, command: ExecutorCommandType, limit: int) -> list[Parked]:
        """Take up to *limit* of the command's oldest parked turns."""
        queue = self._queues.get(command)
        taken: list[Parked] = []
        while queue and len(taken) < limit:
            taken.append(queue.popitem(last=False)[1])
        self._count -= len(taken)
        return taken

    def overdue(self, *, now: float, max_wait_s: float) -> list[Parked]:
        """Take every turn parked *max_wait_s* or longer (oldest first per command type)."""
        taken: list[Parked] = []
        for queue in self._queues.values():
            while queue:
                oldest = next(iter(queue.values()))
                if now - oldest.parked_at < max_wait_s:
                    break
                taken.append(queue.popitem(last=False)[1])
        self._count -= len(taken)
        return taken

    def commands(self) -> list[ExecutorCommandType]:
        """Command types with parked turns."""
        return [c for c, q in self._queues.items() if q]
