"""Time helpers shared by the hub's modules (wall-clock microseconds, whole milliseconds)."""

from __future__ import annotations

import time

__all__ = ["ms", "now_us"]


def now_us() -> int:
    """Wall-clock time in microseconds since the epoch."""
    return time.time_ns() // 1000


def ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds, never negative."""
    return max(0, round(seconds * 1000))
