"""Entries sealed only once a store's fence held (`ledger.pending.PendingLines`), and taken back
out of the chain when the commit that held them fails (`LedgerWriter.withdraw`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import LedgerSyncError, SessionLedgers, verify_session_dir
from ledger.pending import PendingLines


def _ledgers(tmp_path: Path) -> SessionLedgers:
    return SessionLedgers.create(root=tmp_path, tier="default", session_id="SES-pending")


def _turn(ledgers: SessionLedgers, number: int) -> PendingLines:
    return ledgers.turn_lines(
        turn_number=number, query_hash="q" * 64, result_hash="r" * 64, status="succeeded"
    )


def test_pending_lines_take_no_seq_until_sealed(tmp_path: Path) -> None:
    """Made, a turn's entries change neither chain; sealed, they take the next seqs and link to
    the heads; sealed again, they are the same lines."""
    with _ledgers(tmp_path) as ledgers:
        head = ledgers.exec.head
        pending = _turn(ledgers, 1)
        assert not pending.lines
        assert pending.ledger_ids == (ledgers.exec.ledger_id, ledgers.evidence.ledger_id)
        assert ledgers.exec.head == head
        exec_line, _ = pending.seal()
        assert (exec_line.seq, exec_line.previous_hash) == (head[0] + 1, head[1])
        again = pending.seal()
        assert again == pending.lines
        assert again[0] == exec_line


def test_a_withdrawn_turn_leaves_nothing_and_the_next_takes_its_seq(tmp_path: Path) -> None:
    """A refused (rolled back) turn's lines leave the chains: the next turn gets the same seqs,
    the files hold only what was released, and both ledgers verify."""
    with _ledgers(tmp_path) as ledgers:
        refused = _turn(ledgers, 1)
        refused_exec, _ = refused.seal()
        refused.withdraw()
        assert refused.lines == ()
        committed = _turn(ledgers, 2)
        exec_line, _ = committed.seal()
        assert exec_line.seq == refused_exec.seq
        assert exec_line.entry_hash != refused_exec.entry_hash
        ledgers.release(committed.lines)
        ledgers.sync()
        text = ledgers.exec_path.read_text()
        assert '"turn_number":1' not in text
        assert '"turn_number":2' in text
    reports = verify_session_dir(ledgers.session_dir)
    assert [r.entries for r in reports] == [2, 2]


def test_withdrawing_in_reverse_order_unwinds_a_whole_batch(tmp_path: Path) -> None:
    """A batch's transaction failed: its endings leave their chains, last first, and the heads
    are where they were before the batch."""
    with _ledgers(tmp_path) as ledgers:
        heads = (ledgers.exec.head, ledgers.evidence.head)
        batch = [_turn(ledgers, n) for n in (1, 2, 3)]
        for pending in batch:
            pending.seal()
        for pending in reversed(batch):
            pending.withdraw()
        assert (ledgers.exec.head, ledgers.evidence.head) == heads


def test_a_line_that_is_not_the_tail_cannot_be_withdrawn(tmp_path: Path) -> None:
    """Taking back a line that a later one chains onto would leave a hole: the ledger fails
    instead, loudly, and refuses every later append."""
    with _ledgers(tmp_path) as ledgers:
        first = _turn(ledgers, 1)
        first.seal()
        _turn(ledgers, 2).seal()
        with pytest.raises(LedgerSyncError, match="cannot be withdrawn"):
            first.withdraw()
        with pytest.raises(LedgerSyncError):
            _turn(ledgers, 3).seal()


def test_a_bad_record_is_refused_when_made_not_when_sealed(tmp_path: Path) -> None:
    """Validation happens when the entries are made (the caller's error at once), never in the
    middle of a store's commit."""
    from ledger import LedgerRecordError

    with _ledgers(tmp_path) as ledgers, pytest.raises(LedgerRecordError):
        ledgers.turn_lines(
            turn_number=-1, query_hash="q" * 64, result_hash="r" * 64, status="succeeded"
        )
