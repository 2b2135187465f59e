"""Reconnection backoff of the executor SDK: exponential, capped, with optional jitter."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Delay before reconnect attempt ``n`` (0-based): ``initial_s * multiplier**n``, capped at
    ``max_s``, then spread by ``±jitter`` (a fraction) so a fleet does not reconnect in step."""

    initial_s: float = 0.05
    multiplier: float = 2.0
    max_s: float = 5.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.multiplier < 1 or self.max_s < self.initial_s:
            raise ValueError(f"invalid backoff {self!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    def delay(self, attempt: int, *, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0 = the first retry)."""
        base = min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))
        if self.jitter:
            base *= 1 + self.jitter * (2 * rand() - 1)
        return base
