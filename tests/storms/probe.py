"""What a running process costs: resident memory, open fds and threads, read from ``/proc``.

The reliability suites (`tests.storms.chaos`, `tests.storms.soak`) sample the daemon
with `sample_process` and judge growth with `slope`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ProcessSample", "sample_process", "slope"]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One look at a process: RSS in bytes, open file descriptors, threads."""

    rss_bytes: int
    fds: int
    threads: int

    @property
    def rss_mb(self) -> float:
        return self.rss_bytes / (1024 * 1024)


def sample_process(pid: int) -> ProcessSample:
    """Sample process *pid*; raises ``ProcessLookupError`` when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            status = handle.read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    rss = threads = 0
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            rss = int(value.split()[0]) * 1024
        elif key == "Threads":
            threads = int(value.split()[0])
    return ProcessSample(rss_bytes=rss, fds=fds, threads=threads)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of *ys* over *xs* (0.0 with fewer than two distinct xs)."""
    n = len(xs)
    if n != len(ys):
        msg = f"slope needs as many xs as ys, got {n} and {len(ys)}"
        raise ValueError(msg)
    if n < 2:
        return 0.0
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
