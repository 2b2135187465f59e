"""Parked turns: accepted instruction turns that wait for an executor slot without a task.

A turn that waited inside the executor hub held a task and its whole coroutine stack (about
13 KB in the core, 20 KB with the hub's queue entry): 100,000 queued turns were 2 GB. A turn
whose command type has no free executor slot when it is accepted is *parked* here instead: a
small record (the turn, its claim, when it was parked), queued per command type. It stays
``accepted`` in the store (no attempt has started) and keeps its claim (renewed with the
others). The core starts parked turns as slots free up, in fair order (`fairness`): round robin
across tenants (a session without a tenant is its own), weighted by the session's priority,
oldest first within a tenant. A turn parked longer than the hub's queue wait starts anyway, so
that it meets the hub's usual "no executor" timeout.

Pure bookkeeping: no I/O, no tasks; the core decides when to look. Every operation is O(1) per
turn whatever the number parked.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.store.protocol import Claim, TurnRecord
from supervisor.turns.fairness import FairQueue, Share

__all__ = ["Parked", "ParkedTurns"]


@dataclass(frozen=True, slots=True)
class Parked:
    turn: TurnRecord
    claim: Claim
    parked_at: float


class _Command:
    """The parked turns of one command type: in fair order, and in arrival order (for the
    overdue check)."""

    __slots__ = ("arrivals", "fair")

    def __init__(self) -> None:
        self.fair: FairQueue[str, Parked] = FairQueue()
        self.arrivals: collections.OrderedDict[int, Parked] = collections.OrderedDict()


class ParkedTurns:
    """Parked turns per command type, started in fair order."""

    def __init__(self) -> None:
        self._queues: dict[ExecutorCommandType, _Command] = {}
        self._command_of: dict[int, ExecutorCommandType] = {}

    def __len__(self) -> int:
        return len(self._command_of)

    def count(self, command: ExecutorCommandType) -> int:
        queue = self._queues.get(command)
        return 0 if queue is None else len(queue.arrivals)

    def park(
        self,
        command: ExecutorCommandType,
        turn: TurnRecord,
        claim: Claim,
        now: float,
        share: Share | None = None,
    ) -> None:
        """Park *turn*; *share* says whose turn it is (None: its session's own, weight 1)."""
        queue = self._queues.get(command)
        if queue is None:
            queue = self._queues[command] = _Command()
        parked = Parked(turn, claim, now)
        if share is None:
            share = Share(f"session:{turn.session_id}")
        queue.fair.push(share.key, turn.turn_id, parked, weight=share.weight)
        queue.arrivals[turn.turn_id] = parked
        self._command_of[turn.turn_id] = command

    def remove(self, turn_id: int) -> Parked | None:
        """Take one turn out (a cancel, a lost claim); None when it is not parked."""
        command = self._command_of.pop(turn_id, None)
        if command is None:
            return None
        queue = self._queues[command]
        queue.fair.remove(turn_id)
        return queue.arrivals.pop(turn_id)

    def pop(self, command: ExecutorCommandType, limit: int) -> list[Parked]:
        """Take up to *limit* of the command's parked turns, the next ones in fair order."""
        queue = self._queues.get(command)
        taken: list[Parked] = []
        while queue is not None and len(taken) < limit:
            parked = queue.fair.pop()
            if parked is None:
                break
            del queue.arrivals[parked.turn.turn_id]
            del self._command_of[parked.turn.turn_id]
            taken.append(parked)
        return taken

    def command(self, turn_id: int) -> ExecutorCommandType | None:
        """The command type *turn_id* is parked under; None when it is not parked."""
        return self._command_of.get(turn_id)

    def overdue(
        self,
        *,
        now: float,
        max_wait_s: float,
        keep: frozenset[ExecutorCommandType] = frozenset(),
    ) -> list[Parked]:
        """Take every turn parked *max_wait_s* or longer (oldest first per command type),
        except those of the command types in *keep* (they wait on)."""
        taken: list[Parked] = []
        for command, queue in self._queues.items():
            if command in keep:
                continue
            arrivals = queue.arrivals
            while arrivals:
                oldest = next(iter(arrivals.values()))
                if now - oldest.parked_at < max_wait_s:
                    break
                turn_id = oldest.turn.turn_id
                del arrivals[turn_id]
                queue.fair.remove(turn_id)
                del self._command_of[turn_id]
                taken.append(oldest)
        return taken

    def commands(self) -> list[ExecutorCommandType]:
        """Command types with parked turns."""
        return [c for c, q in self._queues.items() if q.arrivals]
