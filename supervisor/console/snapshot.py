"""A daemon answer shared by every browser for a moment: the overview's ``status``.

Each open overview re-reads its page when an event says something changed; without sharing,
fifty browsers would ask the daemon fifty times for the same status each time. `Snapshot` asks
at most once per `max_age_s` and lets every page in that window read the same answer (those
that arrive while it is being fetched wait for that one fetch).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio

__all__ = ["Snapshot"]

T = TypeVar("T")


@dataclass(slots=True)
class Snapshot(Generic[T]):
    max_age_s: float = 1.0
    _value: T | None = None
    _at: float = float("-inf")
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    async def get(self, fetch: Callable[[], Awaitable[T]]) -> T:
        async with self._lock:
            now = anyio.current_time()
            if self._value is None or now - self._at > self.max_age_s:
                self._value = await fetch()
                self._at = anyio.current_time()
            return self._value
