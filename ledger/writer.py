"""The ledger writer: one per file, appends sealed entries, durable before acknowledged.

Opening a ledger: take the writer lock (``flock`` on ``<file>.lock``, which records the holder's
pid), move a torn last line aside to ``<file>.broken`` and truncate it away, verify every
remaining line and the anchored head, make the recovered content durable and anchor its head.

Appending: normalize and validate the record (outside the lock), then under the lock assign
``seq``/``previous_hash``/``ts_us``, seal, and ``write`` the line to the ``O_APPEND`` file
descriptor; finally wait for the syncer to make it durable. Only then does ``append`` return.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Final

import structlog

from ledger.canonical import decode, normalize
from ledger.chain import FORMAT_VERSION, genesis_hash, seal
from ledger.checkpoints import checkpoint_record, state_from_scan
from ledger.entries import LedgerEntry, SealedLine, validate_ledger_id, validate_record
from ledger.errors import (
    IntegrityError,
    LedgerClosedError,
    LedgerLockedError,
    LedgerSyncError,
)
from ledger.files import fsync_dir, make_dirs
from ledger.heads import Head, HeadAnchor, HeadStore, read_head, resolve_head_path
from ledger.syncer import InlineSyncer, Syncer, Waiter, await_durable, dispatch
from ledger.verify import scan_bytes

__all__ = ["Clock", "LedgerWriter", "open_ledger", "wall_clock_us"]

_log = structlog.get_logger("ledger")

Clock = Callable[[], int]
ANCHOR_SYNC_INTERVAL_S: Final = 1.0
MAX_PENDING_BYTES: Final = 1 << 20


def wall_clock_us() -> int:
    """Microseconds since the epoch."""
    return time.time_ns() // 1000


def _read_lock_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _acquire_lock(path: Path) -> int:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_lock_pid(fd)
        os.close(fd)
        raise LedgerLockedError(path, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _move_torn_tail(path: Path, fd: int, data: bytes) -> bytes:
    """Move bytes after the last newline to ``<file>.broken``; truncate; return what remains."""
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    broken = path.with_name(path.name + ".broken")
    created = not broken.exists()
    header = (
        f"# torn tail of {path.name}: offset {cut}, {len(tail)} bytes, "
        f"file size {len(data)}, moved at ts_us {wall_clock_us()}\n"
    ).encode("ascii")
    broken_fd = os.open(broken, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(broken_fd, header + tail + b"\n")
        os.fsync(broken_fd)
    finally:
        os.close(broken_fd)
    if created:
        fsync_dir(path.parent)
    os.ftruncate(fd, cut)
    os.fsync(fd)
    _log.warning(
        "ledger_torn_tail_moved",
        path=str(path),
        offset=cut,
        bytes=len(tail),
        broken=str(broken),
    )
    return data[:cut]


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
        self._cond = threading.Condition(self._lock)
        self._sync_lock = threading.Lock()
        self._closed = False
        self._failure: str | None = None
        self._waiters: list[tuple[int, Waiter]] = []
        self._pending: list[bytes] = []
        #: ``(seq, entry_hash)`` of each line in ``_pending``, in the same order
        self._pending_marks: list[tuple[int, str]] = []
        self._pending_bytes = 0
        #: seqs of queued lines held back from the file until `release` (their commit is due)
        self._held: set[int] = set()
        self.device = 0
        self.legacy_entries = 0
        self.head_path = path
        make_dirs(path.parent)
        self._lock_fd = _acquire_lock(path)
        self._fd = -1
        self._anchor: HeadAnchor | None = None
        try:
            self._open_file(head_store)
        except BaseException:
            self._release()
            raise

    def _open_file(self, head_store: HeadStore | Path | None) -> None:
        path = self._path
        created = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if created:
            fsync_dir(path.parent)
        self.device = os.fstat(self._fd).st_dev
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        head_path = resolve_head_path(path, head_store)
        anchored = read_head(head_path)
        complete = data[: data.rfind(b"\n") + 1]
        # Verify everything before the torn tail first: a file that fails (e.g. an anchored
        # entry lost its newline) is refused untouched; only then is the tail moved aside.
        scan = scan_bytes(complete, path, ledger_id=self.ledger_id, anchor=anchored)
        if len(complete) < len(data):
            data = _move_torn_tail(path, self._fd, data)
        self.legacy_entries = scan.legacy_entries
        self._seq = scan.head_seq
        self._hash = (
            scan.head_hash if scan.entries else genesis_hash(self.ledger_id, scan.legacy_prefix)
        )
        self._last_ts = scan.last_ts_us
        if data:
            os.fdatasync(self._fd)  # a crashed writer's lines may be in the page cache only
        self._written = (self._seq, self._hash)
        self._synced_seq = self._seq
        self._anchor = HeadAnchor(head_path)
        self._anchor.write(Head(self._seq, self._hash))  # the recovered content is durable
        self._anchor.sync()
        self._anchor_synced_at = time.monotonic()
        self.head_path = head_path

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
            return self._synced_seq

    @property
    def failed(self) -> bool:
        """True once a sync or write failed (every later append raises `LedgerSyncError`)."""
        return self._failure is not None

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
            if not hold and self._held:
                self._held.clear()
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
            if hold:
                self._held.add(seq)
            self._queue_locked(line, seq, digest)
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
            if self._held:
                self._held.difference_update(seqs)

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
            count = len(wanted)
            marks = self._pending_marks
            tail = {seq for seq, _ in marks[-count:]} if len(marks) >= count else set()
            if tail != wanted or not wanted <= self._held or marks[-1][0] != self._seq:
                cause = (
                    f"lines {sorted(wanted)} cannot be withdrawn: they are not the chain's last"
                    f" held lines (head seq {self._seq})"
                )
                dispatch(self._fail_locked(cause))
                raise LedgerSyncError(self._path, cause)
            removed = self._pending[-count:]
            del self._pending[-count:]
            del marks[-count:]
            self._pending_bytes -= sum(len(line) for line in removed)
            self._held.difference_update(wanted)
            self._seq, self._hash = marks[-1] if marks else self._written

    def release_all(self) -> None:
        """Let every held line go to the file with the next flush or sync (a line that must be
        durable now is sealed behind them, in this ledger or its sibling)."""
        with self._lock:
            self._held.clear()

    @property
    def ready_seq(self) -> int:
        """The last seq that may reach the file now: the chain's head, or the line before the
        first one still held (what a sync round can make durable without waiting for a
        commit)."""
        with self._lock:
            return self._ready_locked()[0]

    def _ready_locked(self) -> tuple[int, str]:
        if not self._held:
            return self._seq, self._hash
        ready = self._written
        for mark in self._pending_marks:
            if mark[0] in self._held:
                break
            ready = mark
        return ready

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
                if sealed.seq == self._seq and sealed.entry_hash != self._hash:
                    msg = f"the file holds another line at seq {sealed.seq} (a forked chain)"
                    raise IntegrityError(self._path, 0, sealed.seq, msg)
                if sealed.seq <= self._seq:
                    continue
                fields = self._check_restored(sealed)
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

    def _check_restored(self, sealed: SealedLine) -> dict[str, object]:
        def refuse(reason: str) -> IntegrityError:
            return IntegrityError(
                self._path, 0, sealed.seq, f"the store's line cannot be restored: {reason}"
            )

        if sealed.ledger_id != self.ledger_id:
            raise refuse(f"it belongs to ledger {sealed.ledger_id!r}")
        if sealed.seq != self._seq + 1:
            raise refuse(f"the file ends at seq {self._seq} (a gap)")
        try:
            entry = decode(sealed.line)
        except ValueError as exc:
            raise refuse(f"not JSON ({exc})") from None
        if not isinstance(entry, dict):
            raise refuse("not a JSON object")
        fields = {k: v for k, v in entry.items() if k != "entry_hash"}
        line, digest = seal(dict(fields))
        if line != sealed.line or digest != sealed.entry_hash:
            raise refuse("its bytes are not the sealed entry")
        if fields.get("previous_hash") != self._hash or fields.get("seq") != sealed.seq:
            raise refuse("it does not link to the file's last entry")
        return fields

    def _queue_locked(self, line: bytes, seq: int, entry_hash: str) -> None:
        self._pending.append(line)
        self._pending_marks.append((seq, entry_hash))
        self._pending_bytes += len(line)
        if self._pending_bytes > MAX_PENDING_BYTES:  # bound memory when nobody waits
            try:
                self._flush_locked()
            except OSError as exc:
                dispatch(self._fail_locked(f"write: {type(exc).__name__}: {exc}"))
                raise LedgerSyncError(self._path, self._failure or "write failed") from exc

    def checkpoint(self) -> LedgerEntry:
        """Append a checkpoint entry holding the folded state of everything written so far.

        Reads the file (under the lock, so no half-written line is seen), continues from the
        previous checkpoint, and appends the checkpoint durably. Costs one pass over the file.
        """
        with self._lock:
            self._check_usable()
            try:
                self._flush_locked()
            except OSError as exc:
                dispatch(self._fail_locked(f"write: {type(exc).__name__}: {exc}"))
                raise LedgerSyncError(self._path, self._failure or "write failed") from exc
            size = os.fstat(self._fd).st_size
            data = os.pread(self._fd, size, 0)
        scan = scan_bytes(data, self._path, ledger_id=self.ledger_id, collect=True)
        return self.append(checkpoint_record(state_from_scan(scan, self._path)))

    def flush(self) -> None:
        """Write the queued lines to the file now, without syncing (readers see them; a crash
        of the process keeps them, a power loss may not)."""
        with self._lock:
            if self._failure is not None or self._fd < 0:
                return
            try:
                self._flush_locked()
            except OSError as exc:
                cause = f"write: {type(exc).__name__}: {exc}"
                dispatch(self._fail_locked(cause))
                raise LedgerSyncError(self._path, cause) from exc

    def wait_durable(self, seq: int) -> None:
        """Block until ``seq`` is durable (raises `LedgerSyncError` if the ledger failed)."""
        self._syncer.make_durable(((self, seq),))

    def close(self) -> None:
        """Make everything written durable, anchor the head, release the lock (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            seq = self._ready_locked()[0]
            pending = self._failure is None and seq > self._synced_seq
            if self._held:  # sealed, never committed: the store does not have them either
                _log.warning(
                    "ledger_held_lines_dropped", path=str(self._path), seqs=sorted(self._held)
                )
        try:
            if pending:
                try:
                    self._syncer.make_durable(((self, seq),))
                except LedgerClosedError:  # the shared syncer stopped first: sync here
                    InlineSyncer().make_durable(((self, seq),))
        finally:
            self._release()

    # -- Syncable ----------------------------------------------------------------------------

    @property
    def sync_lock(self) -> threading.Lock:
        """Held by the leader of an inline sync round."""
        return self._sync_lock

    def sync_target(self) -> tuple[int, int, str] | None:
        """Write the queued lines; return ``(fd, seq, entry_hash)`` of the last one if something
        is not yet durable. Raises ``OSError`` if the write fails (the syncer fails the ledger).
        """
        with self._lock:
            if self._failure is not None or self._fd < 0:
                return None
            self._flush_locked()
            if self._written[0] <= self._synced_seq:
                return None
            return self._fd, self._written[0], self._written[1]

    def _flush_locked(self) -> None:
        """Write the queued lines up to the first held one."""
        pending = self._pending
        if not pending:
            return
        count = len(pending)
        if self._held:
            count = 0
            for seq, _ in self._pending_marks:
                if seq in self._held:
                    break
                count += 1
            if count == 0:
                return
        if count == len(pending):
            data = b"".join(pending) if count > 1 else pending[0]
            pending.clear()
            last = self._pending_marks[-1]
            self._pending_marks.clear()
        else:
            data = b"".join(pending[:count])
            del pending[:count]
            last = self._pending_marks[count - 1]
            del self._pending_marks[:count]
        self._pending_bytes -= len(data)
        self._written = last  # what the file holds once the write below returns
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            if written <= 0:
                raise OSError(0, "write wrote nothing")
            view = view[written:]

    def add_waiter(self, seq: int, waiter: Waiter) -> bool:
        """Hand ``waiter`` back from `mark_synced`/`mark_failed` once ``seq`` is durable or the
        ledger failed; return False, without registering, if that is already the case."""
        with self._lock:
            if self._synced_seq >= seq or self._failure is not None:
                return False
            self._waiters.append((seq, waiter))
            return True

    def check_synced(self, seq: int) -> None:
        """Raise `LedgerSyncError` unless ``seq`` is durable."""
        with self._lock:
            if self._synced_seq < seq:
                raise LedgerSyncError(self._path, self._failure or "not synced")

    def mark_synced(self, seq: int, entry_hash: str) -> list[Waiter]:
        """Record durability up to ``seq`` (whose hash is ``entry_hash``), anchor the head,
        wake blocked threads; return the async waiters now due (the syncer dispatches them)."""
        ready: list[Waiter] = []
        with self._lock:
            if seq <= self._synced_seq or self._failure is not None:
                return ready
            self._synced_seq = seq
            if self._waiters:
                ready = [waiter for wanted, waiter in self._waiters if wanted <= seq]
                self._waiters = [item for item in self._waiters if item[0] > seq]
            anchor = self._anchor
            if anchor is not None:
                try:
                    anchor.write(Head(seq, entry_hash))
                    now = time.monotonic()
                    if now - self._anchor_synced_at >= ANCHOR_SYNC_INTERVAL_S:
                        anchor.sync()
                        self._anchor_synced_at = now
                except OSError as exc:
                    _log.error("ledger_anchor_failed", path=str(self._path), error=str(exc))
            self._cond.notify_all()
        return ready

    def mark_failed(self, cause: str) -> list[Waiter]:
        """A sync failed: the ledger refuses every later append; return the async waiters."""
        with self._lock:
            return self._fail_locked(cause)

    def wait_synced(self, seq: int) -> None:
        """Block until ``seq`` is durable or the ledger failed."""
        with self._lock:
            while self._synced_seq < seq and self._failure is None:
                self._cond.wait()
            if self._synced_seq < seq:
                raise LedgerSyncError(self._path, self._failure or "failed")

    # -- internals ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise LedgerSyncError(self._path, self._failure)
        if self._closed:
            raise LedgerClosedError(self._path)

    def _fail_locked(self, cause: str) -> list[Waiter]:
        if self._failure is None:
            self._failure = cause
            _log.error("ledger_failed", path=str(self._path), cause=cause)
        waiters, self._waiters = self._waiters, []
        self._cond.notify_all()
        return [waiter for _seq, waiter in waiters]

    def _release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            anchor, self._anchor = self._anchor, None
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
