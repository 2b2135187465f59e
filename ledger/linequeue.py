"""The lines a ledger writer has sealed but not yet written to its file.

Sealing and writing are apart so that nothing unacknowledged costs a system call: a sealed line
waits here until the next sync round (or `LineQueue.flush`) writes every queued line with one
``write``, just before the round's fdatasync. A line sealed for a caller's commit is *held*: it
has its place in the chain, but neither it nor any line after it reaches the file until it is
released (its commit happened) or withdrawn (it did not), so the file never holds a line that the
caller's store lacks.

Not thread-safe: the writer calls it under its own lock, together with the chain head it keeps.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

__all__ = ["MAX_PENDING_BYTES", "LineQueue"]

#: queued bytes past which the writer writes them out without waiting for a sync round
MAX_PENDING_BYTES: Final = 1 << 20


class LineQueue:
    """Sealed lines waiting for the file, in chain order, some of them held for a commit."""

    __slots__ = ("_bytes", "_held", "_lines", "_marks", "written")

    def __init__(self, written: tuple[int, str]) -> None:
        self._lines: list[bytes] = []
        #: ``(seq, entry_hash)`` of each line in ``_lines``, in the same order
        self._marks: list[tuple[int, str]] = []
        self._bytes = 0
        #: seqs of queued lines held back from the file until `release` (their commit is due)
        self._held: set[int] = set()
        #: ``(seq, entry_hash)`` of the last line written to the file
        self.written = written

    @property
    def oversized(self) -> bool:
        """More is queued than memory should hold when nobody waits (`MAX_PENDING_BYTES`)."""
        return self._bytes > MAX_PENDING_BYTES

    @property
    def held(self) -> list[int]:
        """The seqs still held, in order."""
        return sorted(self._held)

    def add(self, line: bytes, seq: int, entry_hash: str, *, hold: bool = False) -> None:
        """Queue a sealed line (the chain's next); with *hold*, keep it out of the file until
        `release`."""
        if hold:
            self._held.add(seq)
        self._lines.append(line)
        self._marks.append((seq, entry_hash))
        self._bytes += len(line)

    def release(self, seqs: Iterable[int]) -> None:
        """Let these held lines go to the file (unknown or already released seqs are ignored)."""
        if self._held:
            self._held.difference_update(seqs)

    def release_all(self) -> None:
        """Let every held line go to the file."""
        if self._held:
            self._held.clear()

    def ready(self, head: tuple[int, str]) -> tuple[int, str]:
        """The last line that may reach the file now: the chain's *head*, or the line before
        the first one still held."""
        if not self._held:
            return head
        ready = self.written
        for mark in self._marks:
            if mark[0] in self._held:
                break
            ready = mark
        return ready

    def withdraw(self, seqs: set[int], head_seq: int) -> tuple[int, str] | None:
        """Take back the held lines *seqs* if they are the chain's last lines (the chain ends at
        *head_seq*), still held and still queued; return the chain's head without them, or None
        (nothing taken back) when they are not."""
        count = len(seqs)
        marks = self._marks
        tail = {seq for seq, _ in marks[-count:]} if len(marks) >= count else set()
        if tail != seqs or not seqs <= self._held or marks[-1][0] != head_seq:
            return None
        removed = self._lines[-count:]
        del self._lines[-count:]
        del marks[-count:]
        self._bytes -= sum(len(line) for line in removed)
        self._held.difference_update(seqs)
        return marks[-1] if marks else self.written

    def flush(self, fd: int) -> None:
        """Write the queued lines up to the first held one to *fd* (raises ``OSError``)."""
        pending = self._lines
        if not pending:
            return
        count = len(pending)
        if self._held:
            count = 0
            for seq, _ in self._marks:
                if seq in self._held:
                    break
                count += 1
            if count == 0:
                return
        if count == len(pending):
            data = b"".join(pending) if count > 1 else pending[0]
            pending.clear()
            last = self._marks[-1]
            self._marks.clear()
        else:
            data = b"".join(pending[:count])
            del pending[:count]
            last = self._marks[count - 1]
            del self._marks[:count]
        self._bytes -= len(data)
        self.written = last  # what the file holds once the write below returns
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(0, "write wrote nothing")
            view = view[written:]
