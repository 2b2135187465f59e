"""Fair order of waiting work: weighted round robin across keys, first in first out within one.

Turns that wait for an executor slot (`parking`) used to start strictly oldest first, so one
session (or one tenant) that queued thousands of turns made every other session wait behind all
of them. Here each waiting item belongs to a *key* (a tenant label given at ``session.open``,
or the session itself when it has none: Temporal's fairness key) with a *weight* (the session's
priority, 1 to `MAX_PRIORITY`: Temporal's fairness weight). The keys with waiting items form a
ring; the key at the head starts up to *weight* items, oldest first, then goes to the back. A
key that had nothing waiting joins at the back with a full turn.

What this promises (the property tests check it): within a key, items leave in the order they
came; a key with waiting items sees at most the sum of the other waiting keys' weights leave
before one of its own does (one round, so never more than ``(keys - 1) * MAX_PRIORITY``); a key
of weight *w* gets *w* starts in each round that a key of weight 1 gets one. Every operation is
O(1) (``OrderedDict`` moves and pops), whatever the number of waiting items or keys.

When a key's weight changes (sessions of one tenant opened with different priorities), the
latest weight given applies from that key's next turn at the head, as in Temporal.

Pure bookkeeping: no I/O, no clock, no tasks.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

__all__ = ["DEFAULT_PRIORITY", "MAX_PRIORITY", "FairQueue", "Share", "share_of"]

#: Bounds of a session's ``priority`` (its weight among tenants); 1 when none was given.
DEFAULT_PRIORITY: Final = 1
MAX_PRIORITY: Final = 10

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Share:
    """Who a session's waiting turns queue as (``key``) and how many start per round."""

    key: str
    weight: int = DEFAULT_PRIORITY


def share_of(session_id: str, *, tenant: str | None, priority: int | None) -> Share:
    """The share of a session: its tenant's, or (no tenant) its own."""
    key = f"tenant:{tenant}" if tenant is not None else f"session:{session_id}"
    weight = DEFAULT_PRIORITY if priority is None else max(1, min(MAX_PRIORITY, priority))
    return Share(key, weight)


class _Lane(Generic[T]):
    __slots__ = ("credit", "items", "weight")

    def __init__(self, weight: int) -> None:
        self.items: collections.OrderedDict[int, T] = collections.OrderedDict()
        self.weight = weight
        self.credit = weight


class FairQueue(Generic[K, T]):
    """Items by id, in lanes by key; `pop` takes the next item in weighted round-robin order."""

    def __init__(self) -> None:
        # The ring: keys with waiting items, the next to serve first.
        self._ring: collections.OrderedDict[K, _Lane[T]] = collections.OrderedDict()
        self._key_of: dict[int, K] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, item_id: int) -> bool:
        return item_id in self._key_of

    def keys(self) -> int:
        """Keys with waiting items."""
        return len(self._ring)

    def push(self, key: K, item_id: int, item: T, *, weight: int = DEFAULT_PRIORITY) -> None:
        """Queue *item* last in *key*'s lane (a new lane joins the ring at the back)."""
        if item_id in self._key_of:
            msg = f"item {item_id} is already queued"
            raise ValueError(msg)
        lane = self._ring.get(key)
        if lane is None:
            lane = self._ring[key] = _Lane(weight)
        lane.weight = weight
        lane.items[item_id] = item
        self._key_of[item_id] = key

    def pop(self) -> T | None:
        """Take the next item (None when nothing waits)."""
        if not self._ring:
            return None
        key, lane = next(iter(self._ring.items()))
        item_id, item = lane.items.popitem(last=False)
        del self._key_of[item_id]
        lane.credit -= 1
        if not lane.items:
            del self._ring[key]
        elif lane.credit <= 0:
            lane.credit = lane.weight
            self._ring.move_to_end(key)
        return item

    def remove(self, item_id: int) -> T | None:
        """Take one item out wherever it waits (None when it does not)."""
        key = self._key_of.pop(item_id, None)
        if key is None:
            return None
        lane = self._ring[key]
        item = lane.items.pop(item_id)
        if not lane.items:
            del self._ring[key]
        return item
