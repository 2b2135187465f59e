"""What of a ledger is durable, and who waits for it: the writer's side of a sync round.

The syncer reports each round to the writer (`Syncable.mark_synced`, `mark_failed`); this keeps
the highest durable seq, wakes the threads and hands back the async waiters it covers, and
anchors the new head in the head file (synced at most every `ANCHOR_SYNC_INTERVAL_S`, and on
close). A failed sync or write is final (the "fsyncgate" lesson): the cause is kept, every waiter
is woken, and the writer refuses every later append.

Not thread-safe on its own: every method is called with the writer's lock held, the lock its
condition waits on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

import structlog

from ledger.errors import LedgerSyncError
from ledger.heads import Head, HeadAnchor
from ledger.syncer import Waiter

__all__ = ["ANCHOR_SYNC_INTERVAL_S", "Durability"]

_log = structlog.get_logger("ledger")

#: the longest a synced head waits in the page cache before its anchor is synced too
ANCHOR_SYNC_INTERVAL_S: Final = 1.0


class Durability:
    """The durable seq of one ledger, its waiters, its head anchor and its failure."""

    __slots__ = ("_anchor", "_anchored_at", "_cond", "_path", "_waiters", "failure", "synced_seq")

    def __init__(
        self,
        lock: threading.Lock,
        *,
        path: Path,
        synced_seq: int,
        anchor: HeadAnchor,
        anchored_at: float,
    ) -> None:
        self._path = path
        self._cond = threading.Condition(lock)
        self._anchor: HeadAnchor | None = anchor
        self._anchored_at = anchored_at
        self._waiters: list[tuple[int, Waiter]] = []
        #: highest seq known to be durable
        self.synced_seq = synced_seq
        #: why the ledger failed (None while it has not)
        self.failure: str | None = None

    def add_waiter(self, seq: int, waiter: Waiter) -> bool:
        """Register an async waiter for ``seq``; False, without registering, when ``seq`` is
        already durable or the ledger failed."""
        if self.synced_seq >= seq or self.failure is not None:
            return False
        self._waiters.append((seq, waiter))
        return True

    def check(self, seq: int) -> None:
        """Raise `LedgerSyncError` unless ``seq`` is durable."""
        if self.synced_seq < seq:
            raise LedgerSyncError(self._path, self.failure or "not synced")

    def mark_synced(self, seq: int, entry_hash: str) -> list[Waiter]:
        """Record durability up to ``seq``, anchor the head, wake blocked threads; return the
        async waiters now due."""
        ready: list[Waiter] = []
        if seq <= self.synced_seq or self.failure is not None:
            return ready
        self.synced_seq = seq
        if self._waiters:
            ready = [waiter for wanted, waiter in self._waiters if wanted <= seq]
            self._waiters = [item for item in self._waiters if item[0] > seq]
        anchor = self._anchor
        if anchor is not None:
            try:
                anchor.write(Head(seq, entry_hash))
                now = time.monotonic()
                if now - self._anchored_at >= ANCHOR_SYNC_INTERVAL_S:
                    anchor.sync()
                    self._anchored_at = now
            except OSError as exc:
                _log.error("ledger_anchor_failed", path=str(self._path), error=str(exc))
        self._cond.notify_all()
        return ready

    def fail(self, cause: str) -> list[Waiter]:
        """The ledger failed (the first cause is kept): wake blocked threads, return the async
        waiters."""
        if self.failure is None:
            self.failure = cause
            _log.error("ledger_failed", path=str(self._path), cause=cause)
        waiters, self._waiters = self._waiters, []
        self._cond.notify_all()
        return [waiter for _seq, waiter in waiters]

    def wait(self, seq: int) -> None:
        """Block until ``seq`` is durable or the ledger failed (raises `LedgerSyncError`)."""
        while self.synced_seq < seq and self.failure is None:
            self._cond.wait()
        if self.synced_seq < seq:
            raise LedgerSyncError(self._path, self.failure or "failed")

    def detach_anchor(self) -> HeadAnchor | None:
        """Hand over the head anchor for closing (later rounds anchor nothing)."""
        anchor, self._anchor = self._anchor, None
        return anchor
