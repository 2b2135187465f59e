"""Tests of ledger.errors: messages and structured fields."""

from __future__ import annotations

import pickle
from pathlib import Path

from ledger.errors import IntegrityError, LedgerLockedError, LedgerRecordError, LedgerSyncError


def test_integrity_error_message_and_fields() -> None:
    """The message is '<file>:<line>: seq <n>: <reason>'."""
    error = IntegrityError(Path("a/exec.jsonl"), 3, 2, "bad hash")
    assert str(error) == "a/exec.jsonl:3: seq 2: bad hash"
    assert (error.line, error.seq, error.reason) == (3, 2, "bad hash")
    assert str(IntegrityError("x", 1, None, "torn")) == "x:1: seq ?: torn"


def test_errors_pickle() -> None:
    """Errors cross process boundaries (parallel verification) intact."""
    for error in (
        IntegrityError("f", 1, 2, "r"),
        LedgerLockedError("f", 42),
        LedgerRecordError("field", "problem"),
        LedgerSyncError("f", "EIO"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)


def test_locked_error_names_pid() -> None:
    """The holder's pid is in the message."""
    assert "pid 42" in str(LedgerLockedError("f", 42))
    assert "unknown process" in str(LedgerLockedError("f", None))
