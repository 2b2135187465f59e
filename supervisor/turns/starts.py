"""Attempt starts that are written only when the attempt outlives a short delay.

Recording an instruction attempt's start durably before its outcome costs a commit of its own:
with a quick executor the start's commit is still running when the answer arrives, and the
ending waits for it. So a start is only *noted* here when its envelope leaves; if the attempt
is still running after ``delay_s`` (2 ms by default) the start is written then (from then on a
crash finds the turn ``running`` and decides the attempt as a CRASH, as the policy says).
An attempt that ends sooner takes its start back, and the start rides in the same store write
as the attempt's outcome: one commit instead of two.

What this costs: a daemon crash within ``delay_s`` of a dispatch finds the turn ``accepted``
and runs that attempt again under the same number (the executor may see the instruction twice,
as after any crash); the attempt is not counted as a CRASH.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

__all__ = ["DeferredStarts"]


class DeferredStarts:
    """Noted starts by turn id, oldest first; `run` writes each one once it is due."""

    def __init__(self, delay_s: float = 0.002) -> None:
        self.delay_s = delay_s
        self._pending: dict[int, tuple[float, Callable[[], None]]] = {}
        self._wake: anyio.Event | None = None
        self.written = 0
        self.taken_back = 0

    def __len__(self) -> int:
        return len(self._pending)

    def note(self, turn_id: int, write: Callable[[], None]) -> None:
        """*write* queues the start's store write; it is called by `run` once due."""
        self._pending[turn_id] = (time.monotonic() + self.delay_s, write)
        if self._wake is not None:
            self._wake.set()

    def take_back(self, turn_id: int) -> bool:
        """The attempt ended: True when its start was not written yet (it rides with the
        outcome), False when it was (or was never noted)."""
        if self._pending.pop(turn_id, None) is None:
            return False
        self.taken_back += 1
        return True

    def write_due(self, now: float) -> None:
        """Write every start that is due (the oldest come first)."""
        while self._pending:
            turn_id, (due, write) = next(iter(self._pending.items()))
            if due > now:
                return
            del self._pending[turn_id]
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
