"""The clock that stamps entries: integer microseconds since the epoch (``ts_us``).

A module of its own because the writer, the torn-tail record of `recovery` and the session's
violation records all read it, and tests inject their own `Clock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "wall_clock_us"]

Clock = Callable[[], int]


def wall_clock_us() -> int:
    """Microseconds since the epoch."""
    return time.time_ns() // 1000
