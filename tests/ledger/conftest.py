"""Shared fixtures of the ledger tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from ledger import InlineSyncer, open_ledger


def _no_sync(fd: int) -> None:
    """Skip fdatasync: for tests about content, not durability (keeps the suite fast)."""


@pytest.fixture
def quick_syncer() -> InlineSyncer:
    """A syncer that writes for real but skips fdatasync."""
    return InlineSyncer(sync=_no_sync)


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog when nobody did; undo it after each test."""
    yield
    structlog.reset_defaults()


def _turn_record(turn: int, status: str = "succeeded") -> dict[str, object]:
    return {
        "kind": "turn",
        "session_id": "SES-test",
        "turn_number": turn,
        "query_hash": f"q{turn}",
        "result_hash": f"r{turn}",
        "status": status,
    }


TurnRecord = Callable[..., dict[str, object]]
WriteLedger = Callable[..., None]


@pytest.fixture
def turn_record() -> TurnRecord:
    """Build an exec turn record: ``turn_record(turn, status="succeeded")``."""
    return _turn_record


@pytest.fixture
def write_ledger(quick_syncer: InlineSyncer) -> WriteLedger:
    """``write_ledger(path, count, ledger_id="SES-test/exec")``: write exec turn entries."""

    def write(path: Path, count: int, *, ledger_id: str = "SES-test/exec") -> None:
        with open_ledger(path, ledger_id=ledger_id, syncer=quick_syncer) as writer:
            for turn in range(1, count + 1):
                writer.append(_turn_record(turn))

    return write
