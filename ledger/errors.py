"""Exceptions raised by the ledger package.

Every exception carries structured keyword fields (``path``, ``line``, ``seq``, ``pid``...) so the
daemon's logs and the CLI can report them without parsing messages. "We closed it"
(`LedgerClosedError`) is kept apart from "it broke" (`LedgerSyncError`, `IntegrityError`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "IntegrityError",
    "LedgerClosedError",
    "LedgerError",
    "LedgerLockedError",
    "LedgerRecordError",
    "LedgerSyncError",
]


class LedgerError(Exception):
    """Base class of every error this package raises on purpose."""


class IntegrityError(LedgerError):
    """Raised when a ledger file fails verification.

    ``line`` is the 1-based line number (0 when the problem is not tied to a line, e.g. a missing
    file of a session), ``seq`` the entry's sequence number when known. Raised for a bad hash, a
    broken link, non-canonical bytes, a seq gap, a wrong ledger id, truncation below the anchored
    head, a hash-less entry after a hashed one, an undecodable or torn line. Never "repaired".
    """

    def __init__(self, path: Path | str, line: int, seq: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.seq = seq
        self.reason = reason
        seq_text = "?" if seq is None else str(seq)
        super().__init__(f"{self.path}:{line}: seq {seq_text}: {reason}")

    def __reduce__(self) -> tuple[type[IntegrityError], tuple[Path, int, int | None, str]]:
        return (type(self), (self.path, self.line, self.seq, self.reason))


class LedgerRecordError(LedgerError, ValueError):
    """Raised by ``append`` when a record cannot be written: a float, NaN, a non-string or
    non-ASCII key, an integer outside +-(2**53 - 1), an unsupported type, a reserved key, or a
    required field missing for the entry's kind. ``field`` names the offending key path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")

    def __reduce__(self) -> tuple[type[LedgerRecordError], tuple[str, str]]:
        return (type(self), (self.field, self.problem))


class LedgerClosedError(LedgerError):
    """Raised when appending to a ledger writer (or session) that was closed by its owner."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: ledger writer is closed")


class LedgerLockedError(LedgerError):
    """Raised by ``open_ledger`` when another writer (another process, or another open in this
    process) holds the ledger's lock; ``pid`` is the holder's pid when it could be read."""

    def __init__(self, path: Path | str, pid: int | None) -> None:
        self.path = Path(path)
        self.pid = pid
        holder = "an unknown process" if pid is None else f"pid {pid}"
        super().__init__(f"{self.path}: ledger is locked by another writer ({holder})")

    def __reduce__(self) -> tuple[type[LedgerLockedError], tuple[Path, int | None]]:
        return (type(self), (self.path, self.pid))


class LedgerSyncError(LedgerError):
    """Raised when making an append durable failed (fdatasync/syncfs or write error).

    Fatal for that ledger: the writer enters a failed state, the failing sync is never retried,
    and every later append raises this error again (the PostgreSQL "fsyncgate" lesson)."""

    def __init__(self, path: Path | str, cause: str) -> None:
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"{self.path}: ledger failed, appends are refused: {cause}")

    def __reduce__(self) -> tuple[type[LedgerSyncError], tuple[Path, str]]:
        return (type(self), (self.path, self.cause))
