"""The ledger writer: one per file, appends sealed entries, durable before acknowledged.

Opening a ledger: take the writer lock (``flock`` on ``<file>.lock``, which records the holder's
pid), verify every complete line and the anchored head, move a torn last line aside to
``<file>.broken`` and truncate it away, make the recovered content durable and anchor its head.

Appending: normalize and validate the record (outside the lock), then under the lock assign
``seq``/``previous_hash``/``ts_us``, seal, and queue the line; the next sync round ``write``s it
to the ``O_APPEND`` file descriptor just before its fdatasync, and reports back. Only then does
``append`` return.

`LedgerWriter` is the front that holds these together under one lock: it owns the chain's head
(what the next line links to) and the public calls; the modules below it own the file's lock
(`lockfile`), the recovery on open (`recovery`), the queue of sealed lines (`linequeue`), the
durable seq with its waiters and anchor (`durability`), and the check of lines a store puts back
after a crash (`ledger.restore`, for `LedgerWriter.restore`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

import structlog

from ledger.canonical import normalize
from ledger.chain import FORMAT_VERSION, seal
from ledger.checkpoints import checkpoint_record, state_from_scan
from ledger.clock import Clock, wall_clock_us
from ledger.durability import Durability
from ledger.entries import LedgerEntry, SealedLine, validate_ledger_id, validate_record
from ledger.errors import LedgerClosedError, LedgerSyncError
from ledger.files import make_dirs
from ledger.heads import HeadStore
from ledger.linequeue import LineQueue
from ledger.lockfile import acquire_lock
from ledger.recovery import recover_file
from ledger.restore import restorable
from ledger.syncer import InlineSyncer, Syncer, Waiter, await_durable, dispatch
from ledger.verify import scan_bytes

__all__ = ["Clock", "LedgerWriter", "open_ledger", "wall_clock_us"]

_log = structlog.get_logger("ledger")


class LedgerWriter:
    """The single writer of one ledger file (thread-safe; use `open_ledger`)."""

    def __init__(
        self,
        path: Path,
        *,
        ledger_id: str,
        head_store: HeadStore | Path | None = None,
        syncer: Syncer | None = None,
        clock: Clock = wall_clock_us,
    ) -> None:
        self._path = path
        self.ledger_id = validate_ledger_id(ledger_id)
        self._clock = clock
        self._syncer: Syncer = InlineSyncer() if syncer is None else syncer
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._closed = False
        make_dirs(path.parent)
        self._lock_fd = acquire_lock(path)
        try:
            opened = recover_file(path, ledger_id=self.ledger_id, head_store=head_store)
        except BaseException:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1
            raise
        self._fd = opened.fd
        self.device = opened.device
        self.legacy_entries = opened.legacy_entries
        self.head_path = opened.head_path
        #: the chain's head: what the next sealed line links to
        self._seq = opened.head_seq
        self._hash = opened.head_hash
        self._last_ts = opened.last_ts_us
        self._queue = LineQueue((self._seq, self._hash))
        self._durable = Durability(
            self._lock,
            path=path,
            synced_seq=self._seq,
            anchor=opened.anchor,
            anchored_at=opened.anchored_at,
        )

    # -- public ------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The ledger file."""
        return self._path

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, entry_hash)`` of the last written entry (``seq`` 0 and the genesis hash for an
        empty ledger)."""
        with self._lock:
            return self._seq, self._hash

    @property
    def durable_seq(self) -> int:
        """Highest seq known to be durable."""
        with self._lock:
            return self._durable.synced_seq

    @property
    def failed(self) -> bool:
        """True once a sync or write failed (every later append raises `LedgerSyncError`)."""
        return self._durable.failure is not None

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def append(self, record: Mapping[str, object]) -> LedgerEntry:
        """Seal and write one record; return once it is durable."""
        entry = self.write_entry(record)
        self._syncer.make_durable(((self, entry.seq),))
        return entry

    async def aappend(self, record: Mapping[str, object]) -> LedgerEntry:
        """`append` for async callers: the line is queued in the calling thread, then the task
        awaits durability (see `await_durable`: with a `GroupSyncer` under asyncio without
        holding a worker thread, so thousands of appends can be in flight per sync batch).
        """
        entry = self.write_entry(record)
        await await_durable(self._syncer, ((self, entry.seq),))
        return entry

    def append_many(self, records: Iterable[Mapping[str, object]]) -> list[LedgerEntry]:
        """Seal and write several records; return once all are durable (one sync round)."""
        entries = [self.write_entry(record) for record in records]
        if entries:
            self._syncer.make_durable(((self, entries[-1].seq),))
        return entries

    def write_entry(self, record: Mapping[str, object]) -> LedgerEntry:
        """Seal one record and queue its line, *without* waiting for durability.

        The line is written to the file by the next sync round (one ``write`` per ledger per
        round, just before its fdatasync), so nothing unacknowledged costs a system call here.
        Callers that batch (`SessionLedgers.record_turn`) follow with `wait_durable`.
        """
        return self.write_prepared(self.prepare(record))

    def prepare(self, record: Mapping[str, object]) -> dict[str, object]:
        """Normalize and validate a record for this ledger (raises `LedgerRecordError`)."""
        fields = normalize(record)
        assert isinstance(fields, dict)
        validate_record(self.ledger_id, fields)
        return fields

    def write_prepared(self, fields: dict[str, object]) -> LedgerEntry:
        """`write_entry` for a record returned by `prepare` (which it takes over)."""
        return self.seal_prepared(fields)[0]

    def seal_prepared(
        self, fields: dict[str, object], *, hold: bool = False
    ) -> tuple[LedgerEntry, SealedLine]:
        """`write_prepared` that also returns the sealed line (for a store that makes it
        durable in its own transaction; see `restore`).

        With *hold*, the line takes its place in the chain now but stays out of the file (and
        so do the lines sealed after it) until `release` is called with its seq: the caller's
        store commits it first. A crash before the commit then leaves the file without it, as
        the store is; never one of a turn's two lines in a file that the store does not have.

        A line sealed without *hold* lets every held line before it out: its writer may wait
        for it to be durable (a violation, a checkpoint), and must never wait on a commit that
        its own thread would have to finish (the event loop's, in the daemon).
        """
        with self._lock:
            if not hold:
                self._queue.release_all()
            self._check_usable()
            seq = self._seq + 1
            ts = max(self._clock(), self._last_ts)
            previous = self._hash
            fields["v"] = FORMAT_VERSION
            fields["ledger_id"] = self.ledger_id
            fields["seq"] = seq
            fields["previous_hash"] = previous
            fields["ts_us"] = ts
            line, digest = seal(fields)
            self._queue_locked(line, seq, digest, hold=hold)
            self._seq = seq
            self._hash = digest
            self._last_ts = ts
        return LedgerEntry.from_dict(fields), SealedLine(
            self.ledger_id, seq, digest, line, previous
        )

    def release(self, seqs: Iterable[int]) -> None:
        """Let held lines (`seal_prepared` with *hold*) go to the file with the next flush or
        sync: the store committed them. Unknown or already released seqs are ignored."""
        with self._lock:
            self._queue.release(seqs)

    def withdraw(self, seqs: Iterable[int]) -> None:
        """Take back held lines (`seal_prepared` with *hold*) whose commit was refused or rolled
        back: they leave the chain as if they had never been sealed, and the next line takes
        their seq. They must be the chain's last lines, still held and still queued; anything
        else (a line sealed after them, or one already let out) would leave a line in the file
        that chains onto them, so the ledger fails instead (`LedgerSyncError`): it is reopened
        from its file and the store, never continued over a hole."""
        wanted = set(seqs)
        if not wanted:
            return
        with self._lock:
            self._check_usable()
            head = self._queue.withdraw(wanted, self._seq)
            if head is None:
                cause = (
                    f"lines {sorted(wanted)} cannot be withdrawn: they are not the chain's last"
                    f" held lines (head seq {self._seq})"
                )
                dispatch(self._durable.fail(cause))
                raise LedgerSyncError(self._path, cause)
            self._seq, self._hash = head

    def release_all(self) -> None:
        """Let every held line go to the file with the next flush or sync (a line that must be
        durable now is sealed behind them, in this ledger or its sibling)."""
        with self._lock:
            self._queue.release_all()

    @property
    def ready_seq(self) -> int:
        """The last seq that may reach the file now: the chain's head, or the line before the
        first one still held (what a sync round can make durable without waiting for a
        commit)."""
        with self._lock:
            return self._queue.ready((self._seq, self._hash))[0]

    def restore(self, lines: Iterable[SealedLine]) -> int:
        """Append lines that a store kept durable but the file lost (a crash before the file
        was synced), in order, each checked to continue the chain; durable on return.

        Lines the file already holds (``seq`` at or below its head) are skipped. Returns how
        many were appended. Raises `IntegrityError` when a line does not continue the chain
        (a gap, another ledger, a different previous hash, or bytes that are not the sealed
        entry): the store and the file disagree, which is tampering, not a crash.
        """
        appended = 0
        with self._lock:
            self._check_usable()
            for sealed in lines:
                fields = restorable(
                    sealed, path=self._path, ledger_id=self.ledger_id, head=(self._seq, self._hash)
                )
                if fields is None:
                    continue
                self._queue_locked(sealed.line, sealed.seq, sealed.entry_hash)
                self._seq = sealed.seq
                self._hash = sealed.entry_hash
                ts = fields.get("ts_us")
                self._last_ts = max(self._last_ts, ts if type(ts) is int else 0)
                appended += 1
            seq = self._seq
        if appended:
            self.wait_durable(seq)
        return appended

    def checkpoint(self) -> LedgerEntry:
        """Append a checkpoint entry holding the folded state of everything written so far.

        Reads the file (under the lock, so no half-written line is seen), continues from the
        previous checkpoint, and appends the checkpoint durably. Costs one pass over the file.
        """
        with self._lock:
            self._check_usable()
            self._flush_locked()
            size = os.fstat(self._fd).st_size
            data = os.pread(self._fd, size, 0)
        scan = scan_bytes(data, self._path, ledger_id=self.ledger_id, collect=True)
        return self.append(checkpoint_record(state_from_scan(scan, self._path)))

    def flush(self) -> None:
        """Write the queued lines to the file now, without syncing (readers see them; a crash
        of the process keeps them, a power loss may not)."""
        with self._lock:
            if self._durable.failure is not None or self._fd < 0:
                return
            self._flush_locked()

    def wait_durable(self, seq: int) -> None:
        """Block until ``seq`` is durable (raises `LedgerSyncError` if the ledger failed)."""
        self._syncer.make_durable(((self, seq),))

    def close(self) -> None:
        """Make everything written durable, anchor the head, release the lock (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            seq = self._queue.ready((self._seq, self._hash))[0]
            pending = self._durable.failure is None and seq > self._durable.synced_seq
            held = self._queue.held
            if held:  # sealed, never committed: the store does not have them either
                _log.warning("ledger_held_lines_dropped", path=str(self._path), seqs=held)
        try:
            if pending:
                try:
                    self._syncer.make_durable(((self, seq),))
                except LedgerClosedError:  # the shared syncer stopped first: sync here
                    InlineSyncer().make_durable(((self, seq),))
        finally:
            self._release()

    # -- Syncable (the syncer's side; see `ledger.syncer.Syncable`) -------------------------

    @property
    def sync_lock(self) -> threading.Lock:
        """Held by the leader of an inline sync round."""
        return self._sync_lock

    def sync_target(self) -> tuple[int, int, str] | None:
        """Write the queued lines; return ``(fd, seq, entry_hash)`` of the last one if something
        is not yet durable. Raises ``OSError`` if the write fails (the syncer fails the ledger).
        """
        with self._lock:
            if self._durable.failure is not None or self._fd < 0:
                return None
            self._queue.flush(self._fd)
            written = self._queue.written
            if written[0] <= self._durable.synced_seq:
                return None
            return self._fd, written[0], written[1]

    def add_waiter(self, seq: int, waiter: Waiter) -> bool:
        """Hand ``waiter`` back from `mark_synced`/`mark_failed` once ``seq`` is durable or the
        ledger failed; return False, without registering, if that is already the case."""
        with self._lock:
            return self._durable.add_waiter(seq, waiter)

    def check_synced(self, seq: int) -> None:
        """Raise `LedgerSyncError` unless ``seq`` is durable."""
        with self._lock:
            self._durable.check(seq)

    def mark_synced(self, seq: int, entry_hash: str) -> list[Waiter]:
        """Record durability up to ``seq`` (whose hash is ``entry_hash``), anchor the head,
        wake blocked threads; return the async waiters now due (the syncer dispatches them)."""
        with self._lock:
            return self._durable.mark_synced(seq, entry_hash)

    def mark_failed(self, cause: str) -> list[Waiter]:
        """A sync failed: the ledger refuses every later append; return the async waiters."""
        with self._lock:
            return self._durable.fail(cause)

    def wait_synced(self, seq: int) -> None:
        """Block until ``seq`` is durable or the ledger failed."""
        with self._lock:
            self._durable.wait(seq)

    # -- internals ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._durable.failure is not None:
            raise LedgerSyncError(self._path, self._durable.failure)
        if self._closed:
            raise LedgerClosedError(self._path)

    def _queue_locked(self, line: bytes, seq: int, entry_hash: str, *, hold: bool = False) -> None:
        self._queue.add(line, seq, entry_hash, hold=hold)
        if self._queue.oversized:  # bound memory when nobody waits
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Write the queued lines up to the first held one; a failed write fails the ledger."""
        try:
            self._queue.flush(self._fd)
        except OSError as exc:
            cause = f"write: {type(exc).__name__}: {exc}"
            dispatch(self._durable.fail(cause))
            raise LedgerSyncError(self._path, cause) from exc

    def _release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            anchor = self._durable.detach_anchor()
        try:
            if anchor is not None:
                anchor.close()
        finally:
            if fd >= 0:
                os.close(fd)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = -1


def open_ledger(
    path: Path | str,
    *,
    ledger_id: str,
    head_store: HeadStore | Path | None = None,
    syncer: Syncer | None = None,
    clock: Clock = wall_clock_us,
) -> LedgerWriter:
    """Open (creating if needed) a ledger file for appending.

    Raises `LedgerLockedError` if another writer holds it, `IntegrityError` if its content or
    anchored head fails verification. ``syncer`` defaults to inline leader/follower syncing; pass
    a shared `GroupSyncer` when many ledgers are written concurrently. ``clock`` returns integer
    microseconds (tests inject one); entries' ``ts_us`` never decrease.
    """
    return LedgerWriter(
        Path(path), ledger_id=ledger_id, head_store=head_store, syncer=syncer, clock=clock
    )
