"""The daemon's heap once it is ready to serve.

By the time `hunter serve` listens, its heap holds tens of thousands of long-lived objects
(modules, the configuration, compiled schemas and statements, the registry of metrics) that no
turn will ever free. CPython's cyclic collector would walk them again and again: with the default
thresholds a busy daemon ran a young collection every few hundred turns' worth of allocations and
a full one often enough to cost about a sixth of its CPU, for cycles that are rare in the turn
path. `settle` collects once, moves what survived into the permanent generation (`gc.freeze`:
never scanned again), and raises the thresholds so that the collector still runs, but in
proportion to the garbage a turn leaves, not to the heap the daemon started with.

Only `hunter serve` settles its heap: a daemon run inside another program (the tests, a library
user) leaves that program's collector as it found it.
"""

from __future__ import annotations

import gc
from typing import Final

#: Container allocations between young collections, then young collections per middle one and
#: middle ones per full one (CPython's defaults are 700, 10, 10). A young collection costs in
#: proportion to what is still alive in the young generation, which at any moment is about the
#: turns in flight, whatever the threshold: at 100,000 (was 10,000) a busy daemon collects a
#: tenth as often and lets fewer short-lived cycles reach the older generations. At 64 turns in
#: flight: ~10 % less CPU a turn and a smaller RSS (`bench_daemon.py`, three interleaved rounds,
#: docs/performance.md, issue 30's sixth step).
THRESHOLD: Final = (100_000, 20, 100)


def settle() -> tuple[int, int, int]:
    """Collect, freeze what survived, raise the thresholds; the thresholds now in force."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLD)
    first, second, third = gc.get_threshold()
    return first, second, third
