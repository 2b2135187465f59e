"""`session_adopted`'s ``adopted_as``: a daemon that starts again on the root that homed a
session logs a restart, one that takes another's session logs a takeover."""

from __future__ import annotations

from supervisor.turns.fleet import adopted_as


def test_a_root_that_held_the_files_restarts() -> None:
    """Files here that agree with the store (all of its lines, or a prefix a crash kept from
    them) are this root's own session: a restart."""
    assert adopted_as(ledger_lines=6, written=0, forked=False) == "restart"
    assert adopted_as(ledger_lines=6, written=2, forked=False) == "restart"


def test_files_written_from_the_store_are_a_takeover() -> None:
    """No files here (every line written from the store), or a copy that forked from the
    store's and was moved aside: a takeover."""
    assert adopted_as(ledger_lines=6, written=6, forked=False) == "takeover"
    assert adopted_as(ledger_lines=6, written=6, forked=True) == "takeover"
    assert adopted_as(ledger_lines=0, written=0, forked=False) == "takeover"
