"""Durability: making written entries durable before they are acknowledged.

Two strategies share the `Syncer` protocol:

* `InlineSyncer` (the default of a lone writer): leader/follower group commit per ledger. The
  appender that finds no sync running becomes the leader and calls ``fdatasync`` for everything
  written so far; appenders that arrive meanwhile wait on the leader and are covered by it (or
  lead the next round). No thread hand-off, so a single appender pays one fdatasync per entry.
* `GroupSyncer`: one background thread shared by many ledgers (one per process is enough).
  Appenders queue their sealed line, register the ledger as dirty and wait; the thread takes
  every dirty ledger as one batch, writes and makes the batch durable and wakes the waiters
  (async waiters with one ``call_soon_threadsafe`` per batch). Each ledger's queued lines are
  written with one ``write`` and synced with ``fdatasync``; when a batch holds several ledgers on
  one file system, a single ``syncfs`` can replace the per-file calls (measured on a quiet ext4:
  64 files with one syncfs ~10x faster than 64 sequential fdatasyncs, which do not share a
  journal commit), but syncfs also flushes other processes' dirty data on that file system, so
  under busy neighbours it can cost more. In ``"auto"`` mode the syncer keeps moving averages of
  both costs and picks the cheaper one per batch, probing the other now and then. Errors of
  ``syncfs`` are reported per file system since Linux 5.8, so a failed syncfs fails every ledger
  of its batch.

A failed sync is fatal for the ledger (the "fsyncgate" lesson): the writer is marked failed, the
sync is never retried, and every later append raises `LedgerSyncError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Protocol

import structlog

from ledger.errors import LedgerClosedError

__all__ = [
    "GroupSyncer",
    "InlineSyncer",
    "Syncable",
    "Syncer",
    "SyncerStatistics",
    "Waiter",
    "await_durable",
    "dispatch",
    "running_asyncio",
]

_log = structlog.get_logger("ledger")

SyncFunction = Callable[[int], None]
SYNCFS_MIN_LEDGERS: Final = 4
GATHER_S: Final = 0.0002
PROBE_EVERY: Final = 16


def _ewma(previous: float, sample: float) -> float:
    return 0.8 * previous + 0.2 * sample


class Syncable(Protocol):
    """What a syncer needs from a ledger writer."""

    @property
    def path(self) -> Path:
        """The ledger file."""
        ...

    @property
    def device(self) -> int:
        """``st_dev`` of the ledger file (ledgers on one file system share a syncfs)."""
        ...

    @property
    def sync_lock(self) -> threading.Lock:
        """Held by the leader of an inline sync round."""
        ...

    def sync_target(self) -> tuple[int, int, str] | None:
        """Write queued lines; ``(fd, seq, hash)`` when something is not durable yet."""
        ...

    def mark_synced(self, seq: int, entry_hash: str) -> list[Waiter]:
        """Everything up to ``seq`` is durable: anchor the head, wake blocked threads, return
        the async waiters now due."""
        ...

    def add_waiter(self, seq: int, waiter: Waiter) -> bool:
        """Register an async waiter for ``seq`` (False: already durable or failed)."""
        ...

    def check_synced(self, seq: int) -> None:
        """Raise `LedgerSyncError` unless ``seq`` is durable."""
        ...

    def mark_failed(self, cause: str) -> list[Waiter]:
        """A sync failed: fail the ledger for good, wake threads, return async waiters."""
        ...

    def wait_synced(self, seq: int) -> None:
        """Block until ``seq`` is durable; raise `LedgerSyncError` if the ledger failed."""
        ...


class Syncer(Protocol):
    """Makes written entries durable."""

    def make_durable(self, items: Sequence[tuple[Syncable, int]]) -> None:
        """Block until every ``(ledger, seq)`` is durable (raises `LedgerSyncError`)."""
        ...


def _load_syncfs() -> SyncFunction | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if function(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return syncfs


_SYNCFS: Final = _load_syncfs()


Waiter = tuple[asyncio.AbstractEventLoop, Callable[[], None]]


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


def dispatch(waiters: Sequence[Waiter]) -> None:
    """Run async waiters' callbacks in their loops: one thread-safe wake-up per loop."""
    if not waiters:
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
    for loop, callback in waiters:
        by_loop.setdefault(loop, []).append(callback)
    for loop, callbacks in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop was closed: nobody waits any more
            loop.call_soon_threadsafe(_run_all, callbacks)


def running_asyncio() -> bool:
    """True when called from a task on a running asyncio loop (anyio's asyncio backend)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def await_durable(syncer: Syncer, items: Sequence[tuple[Syncable, int]]) -> None:
    """`Syncer.make_durable` for async callers (the entries are already written).

    With a `GroupSyncer` under asyncio the task awaits the syncing thread's wake-up without
    holding a worker thread, so thousands of waits can share one sync batch; otherwise
    ``make_durable`` runs in a worker thread (not abandoned on cancel).
    """
    if isinstance(syncer, GroupSyncer) and running_asyncio():
        await syncer.make_durable_async(items)
        return
    import anyio.to_thread  # lazy: keeps `import ledger` light for the CLI

    await anyio.to_thread.run_sync(syncer.make_durable, items)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InlineSyncer:
    """Leader/follower group commit per ledger, run by the appending threads themselves."""

    def __init__(self, *, sync: SyncFunction = os.fdatasync) -> None:
        self._sync = sync

    def make_durable(self, items: Sequence[tuple[Syncable, int]]) -> None:
        """Sync each ledger up to its seq (one fdatasync covers every waiting appender)."""
        for ledger, seq in items:
            with ledger.sync_lock:
                try:
                    target = ledger.sync_target()
                except OSError as exc:
                    dispatch(ledger.mark_failed(f"write: {_describe(exc)}"))
                    target = None
                if target is not None:
                    fd, written, digest = target
                    try:
                        self._sync(fd)
                    except OSError as exc:
                        dispatch(ledger.mark_failed(_describe(exc)))
                    else:
                        dispatch(ledger.mark_synced(written, digest))
            ledger.wait_synced(seq)


@dataclass(frozen=True, slots=True)
class SyncerStatistics:
    """Counters of a `GroupSyncer`."""

    batches: int
    ledgers_synced: int
    fdatasync_calls: int
    syncfs_calls: int
    failures: int
    sync_seconds: float


class GroupSyncer:
    """One background thread making many ledgers durable in shared batches.

    ``sync`` replaces ``os.fdatasync`` (tests inject a failing one). ``mode``: ``"auto"`` (for a
    batch of at least ``syncfs_min_ledgers`` ledgers on one file system, syncfs or per-file
    fdatasync, whichever the measured costs say is cheaper), ``"syncfs"`` (always syncfs for such
    batches) or ``"fdatasync"`` (always per file). An injected ``sync`` disables syncfs unless
    ``syncfs`` is injected too. ``observe``, if given, is called on the syncing thread with each
    batch's sync time in seconds (the daemon's latency histogram); what it raises is ignored.
    """

    def __init__(
        self,
        *,
        sync: SyncFunction | None = None,
        syncfs: SyncFunction | None = None,
        mode: Literal["auto", "fdatasync", "syncfs"] = "auto",
        syncfs_min_ledgers: int = SYNCFS_MIN_LEDGERS,
        gather_s: float = GATHER_S,
        name: str = "ledger-group-syncer",
        observe: Callable[[float], None] | None = None,
    ) -> None:
        #: told each batch's sync time in seconds, on the syncing thread (the daemon's metrics)
        self._observe = observe
        self._sync: SyncFunction = os.fdatasync if sync is None else sync
        if syncfs is None and sync is None and mode != "fdatasync":
            self._syncfs = _SYNCFS
        else:
            self._syncfs = syncfs if mode != "fdatasync" else None
        self._mode = mode
        self._syncfs_min = max(1, syncfs_min_ledgers)
        self._syncfs_cost = 0.001  # seconds, moving averages, refined as batches are synced
        self._fdatasync_cost = 0.0005
        self._eligible = 0
        self._gather_s = gather_s
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._dirty: dict[Syncable, None] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._batches = 0
        self._ledgers = 0
        self._fdatasyncs = 0
        self._syncfs_calls = 0
        self._failures = 0
        self._sync_seconds = 0.0

    def __enter__(self) -> GroupSyncer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def statistics(self) -> SyncerStatistics:
        """A snapshot of the counters."""
        with self._cond:
            return SyncerStatistics(
                batches=self._batches,
                ledgers_synced=self._ledgers,
                fdatasync_calls=self._fdatasyncs,
                syncfs_calls=self._syncfs_calls,
                failures=self._failures,
                sync_seconds=self._sync_seconds,
            )

    def make_durable(self, items: Sequence[tuple[Syncable, int]]) -> None:
        """Queue the ledgers for the next batch and block until each seq is durable."""
        self._enqueue(items)
        for ledger, seq in items:
            ledger.wait_synced(seq)

    async def make_durable_async(self, items: Sequence[tuple[Syncable, int]]) -> None:
        """`make_durable` for a task on an asyncio loop, without a thread per waiter.

        The syncing thread wakes the task with ``loop.call_soon_threadsafe``. Cancelling the
        task abandons the wait, not the entries (they stay written and become durable).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        pending = [len(items)]

        def one_done() -> None:  # in the loop's thread
            pending[0] -= 1
            if pending[0] <= 0 and not future.done():
                future.set_result(None)

        waiter: Waiter = (loop, one_done)
        self._enqueue(items)
        for ledger, seq in items:
            if not ledger.add_waiter(seq, waiter):
                pending[0] -= 1
        if pending[0] > 0:
            await future
        for ledger, seq in items:
            ledger.check_synced(seq)

    def _enqueue(self, items: Sequence[tuple[Syncable, int]]) -> None:
        with self._cond:
            if self._closed:
                raise LedgerClosedError(items[0][0].path if items else "<group syncer>")
            if self._pid != os.getpid():  # forked child: the parent's thread does not exist here
                self._pid = os.getpid()
                self._thread = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            for ledger, _seq in items:
                self._dirty[ledger] = None
            self._cond.notify()

    def close(self) -> None:
        """Finish the pending batch and stop the thread (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and self._pid == os.getpid():
            thread.join()

    def _run(self) -> None:
        previous = 0
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if not self._dirty:
                    return
                if (
                    self._gather_s > 0
                    and len(self._dirty) < self._syncfs_min <= previous
                    and not self._closed
                ):
                    # Busy (the last batch was large) but few ledgers are dirty yet: give the
                    # appenders a moment to join this batch (PostgreSQL's commit_delay).
                    self._cond.wait(self._gather_s)
                batch = list(self._dirty)
                self._dirty.clear()
            previous = len(batch)
            try:
                self._sync_batch(batch)
            except Exception as exc:  # a bug or an injected sync raising oddly: never hang waiters
                _log.exception("ledger_syncer_error")
                due: list[Waiter] = []
                for ledger in batch:
                    due.extend(ledger.mark_failed(f"syncer error: {_describe(exc)}"))
                dispatch(due)

    def _use_syncfs(self, ledgers: int) -> bool:
        """Adaptive choice for a batch of ``ledgers`` dirty ledgers on one file system.

        syncfs costs one call but also flushes other processes' dirty data on that file system,
        so its price depends on the neighbours; fdatasync costs one call per ledger. Both costs
        are tracked (moving averages) and the cheaper estimate wins; every 16th eligible batch
        takes the other path to keep its estimate current.
        """
        if self._syncfs is None or ledgers < self._syncfs_min:
            return False
        if self._mode == "syncfs":
            return True
        self._eligible += 1
        cheaper = self._syncfs_cost < ledgers * self._fdatasync_cost
        if self._eligible % PROBE_EVERY == 0:
            return not cheaper
        return cheaper

    def _sync_batch(self, batch: list[Syncable]) -> None:
        targets: list[tuple[Syncable, int, int, str]] = []
        due: list[Waiter] = []
        failures = 0
        for ledger in batch:
            try:
                target = ledger.sync_target()
            except OSError as exc:
                failures += 1
                due.extend(ledger.mark_failed(f"write: {_describe(exc)}"))
                continue
            if target is not None:
                targets.append((ledger, *target))
        by_device: dict[int, list[tuple[Syncable, int, int, str]]] = {}
        for item in targets:
            by_device.setdefault(item[0].device, []).append(item)
        fdatasyncs = syncfs_calls = 0
        batch_started = time.perf_counter()
        for group in by_device.values():
            if self._use_syncfs(len(group)):
                syncfs_calls += 1
                started = time.perf_counter()
                try:
                    self._syncfs(group[0][1])  # type: ignore[misc]
                except OSError as exc:
                    failures += len(group)
                    for ledger, _fd, _seq, _digest in group:
                        due.extend(ledger.mark_failed(f"syncfs: {_describe(exc)}"))
                    continue
                self._syncfs_cost = _ewma(self._syncfs_cost, time.perf_counter() - started)
                for ledger, _fd, seq, digest in group:
                    due.extend(ledger.mark_synced(seq, digest))
                continue
            started = time.perf_counter()
            for ledger, fd, seq, digest in group:
                fdatasyncs += 1
                try:
                    self._sync(fd)
                except OSError as exc:
                    failures += 1
                    due.extend(ledger.mark_failed(_describe(exc)))
                else:
                    due.extend(ledger.mark_synced(seq, digest))
            per_call = (time.perf_counter() - started) / len(group)
            self._fdatasync_cost = _ewma(self._fdatasync_cost, per_call)
        sync_seconds = time.perf_counter() - batch_started
        dispatch(due)
        if failures:
            _log.error("ledger_sync_failed", ledgers=failures)
        with self._cond:
            self._batches += 1
            self._ledgers += len(targets)
            self._fdatasyncs += fdatasyncs
            self._syncfs_calls += syncfs_calls
            self._failures += failures
            self._sync_seconds += sync_seconds
        if self._observe is not None and targets:
            with contextlib.suppress(Exception):  # an observer never fails a batch
                self._observe(sync_seconds)
