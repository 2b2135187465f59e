"""The cost of each stage of an instruction turn's path, in CPU time, for `hunter status` and
`benchmarks/bench_daemon.py` (issue 20: "so that the next person sees where the time goes").

Eight stages, in the order a turn meets them:

* ``decode``   a control frame's body to a typed request (`supervisor.wire.control`);
* ``admit``    the intake rules, the session and queue checks, the accept queued
  (`TurnCore.submit`, up to the store);
* ``store``    the store's work for accepts and attempt starts (SQL on the store's thread);
* ``dispatch`` the envelope built and written to an executor (`flights.InstructionFlights`);
* ``judge``    an executor's answer judged (Phase-20 response rules) and decided (the policy);
* ``seal``     the turn's exec and evidence lines sealed into their hash chains;
* ``commit``   the store's work for endings, and the commit itself (without the fsync wait);
* ``reply``    the answer built, encoded and handed to the control socket.

Each is measured with `time.thread_time_ns` (CPU of the measuring thread: a wait for the disk,
a lock or the GIL costs nothing) around code that does not await, and kept as nanoseconds and a
count per stage. That clock is a system call (about 0.7 µs here, some 10 µs per turn for all
stages), so the costs are counted only when ``HUNTER_STAGE_COSTS=1`` is in the daemon's
environment (`bench_daemon.py` sets it); otherwise the clock is a constant and each stage
costs two calls that do nothing.

What the stages do not cover is the event loop itself (tasks, polling the sockets, wake-ups),
the ledger files' writes and syncs, logging, and the GIL's hand-overs between the loop and the
store's thread: `bench_daemon.py` prints that rest as the difference to the daemon's whole CPU
per turn.

One process-wide ledger of costs (like a metrics registry): several daemons in one process
(tests) add up; the figures are diagnostics, never decisions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final

__all__ = ["ENV", "STAGES", "StageCosts", "stage_costs"]

STAGES: Final = ("decode", "admit", "store", "dispatch", "judge", "seal", "commit", "reply")
#: The environment variable that turns the counting on ("1").
ENV: Final = "HUNTER_STAGE_COSTS"


def _off() -> int:
    return 0


class StageCosts:
    """Nanoseconds and counts per stage (see the module docstring). ``clock()`` is CPU time of
    the calling thread in nanoseconds while counting is on, else 0."""

    __slots__ = ("clock", "counts", "ns", "on")

    def __init__(self, *, on: bool = False) -> None:
        self.ns: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.counts: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.on = False
        self.clock: Callable[[], int] = _off
        self.turn(on=on)

    def turn(self, *, on: bool) -> None:
        """Start (or stop) counting."""
        self.on = on
        self.clock = time.thread_time_ns if on else _off

    def add(self, stage: str, ns: int, count: int = 1) -> None:
        if self.on:
            self.ns[stage] += ns
            self.counts[stage] += count

    def snapshot(self) -> dict[str, object]:
        """``{"on": bool, "stages": {stage: {"ns": total, "count": n}}}`` (stages in order)."""
        stages = {s: {"ns": self.ns[s], "count": self.counts[s]} for s in STAGES}
        return {"on": self.on, "stages": stages}


_COSTS: Final = StageCosts(on=os.environ.get(ENV) == "1")


def stage_costs() -> StageCosts:
    """The process's stage costs."""
    return _COSTS
