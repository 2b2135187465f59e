"""Attempt starts that are written only when the attempt outlives a short delay.

Recording an attempt's start durably before its outcome costs a commit of its own: with a
quick executor (or a quick command: a process turn's first attempt is deferred the same way)
the start's commit is still running when the answer arrives, and the ending waits for it. So
a start is only *noted* here when its envelope leaves (its process is spawned); if the attempt
is still running after the delay the start is written then (from then on a crash finds the
turn ``running`` and decides the attempt as a CRASH, as the policy says). An attempt that ends
sooner takes its start back, and the start rides in the same store write as the attempt's
outcome: one commit instead of two.

The delay follows how long attempts take: three times the moving average of the attempts seen
(an attempt whose start was written counts as twice the delay, so the average climbs when most
outlive it), never above ``max_delay_s`` (250 ms) nor below ``delay_s`` (2 ms; the floor
wins). With 64 turns in flight an attempt's round trip is tens of milliseconds: a fixed 2 ms
wrote almost every start, one store write per turn more. An attempt that runs for seconds
still has its start written within 250 ms.

What this costs: a daemon crash within the delay of a dispatch finds the turn ``accepted``
and runs that attempt again under the same number (the executor may see the instruction twice,
a command may run twice, as after any crash); the attempt is not counted as a CRASH. A process
turn's outputs are placed only after its ending committed, so a run cut short this way leaves
nothing in the workspace, and what it left running is killed when the runtime starts again
(`sandbox.runtime.leftovers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

__all__ = ["DeferredStarts"]


class DeferredStarts:
    """Noted starts by turn id, oldest first; `run` writes each one once it is due."""

    def __init__(self, delay_s: float = 0.002, *, max_delay_s: float = 0.25) -> None:
        self.delay_s = delay_s
        self.max_delay_s = max_delay_s
        self._average_s = delay_s / 3
        #: when the attempt of each noted turn was noted (kept until it is taken back)
        self._noted: dict[int, float] = {}
        self._pending: dict[int, tuple[float, Callable[[], None]]] = {}
        self._wake: anyio.Event | None = None
        self.written = 0
        self.taken_back = 0

    def __len__(self) -> int:
        return len(self._pending)

    def note(self, turn_id: int, write: Callable[[], None]) -> None:
        """*write* queues the start's store write; it is called by `run` once due."""
        now = time.monotonic()
        self._noted[turn_id] = now
        self._pending[turn_id] = (now + self.delay, write)
        if self._wake is not None:
            self._wake.set()

    def take_back(self, turn_id: int) -> bool:
        """The attempt ended: True when its start was not written yet (it rides with the
        outcome), False when it was (or was never noted)."""
        noted = self._noted.pop(turn_id, None)
        if self._pending.pop(turn_id, None) is None:
            return False
        if noted is not None:
            self._average_s = self._average_s * 0.9 + (time.monotonic() - noted) * 0.1
        self.taken_back += 1
        return True

    @property
    def delay(self) -> float:
        """How long a start waits now before it is written (see the module's docstring)."""
        return max(self.delay_s, min(self.max_delay_s, 3 * self._average_s))

    def write_due(self, now: float) -> None:
        """Write every start that is due (the oldest come first)."""
        while self._pending:
            turn_id, (due, write) = next(iter(self._pending.items()))
            if due > now:
                return
            del self._pending[turn_id]
            self._noted.pop(turn_id, None)
            self._average_s = self._average_s * 0.9 + 2 * self.delay * 0.1
            self.written += 1
            write()

    async def run(self) -> None:
        """Write starts as they fall due, until cancelled."""
        while True:
            if not self._pending:
                self._wake = anyio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            due = next(iter(self._pending.values()))[0]
            wait = due - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
            self.write_due(time.monotonic())
