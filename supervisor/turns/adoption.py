"""A session's ledger files on this root, when its home comes here from the store.

Taking a session over (`homes.Homes.adopt`) rebuilds its ledger files from the store's anchored
lines (`ledger.SessionLedgers.adopt`, every line checked to continue the chain). A copy on this
root that went on past the store's (another daemon appended to the chain meanwhile) is a stale
fork: it is moved aside, with its anchored heads, and the files are written afresh.

This is file work on a worker thread, apart from the homes' bookkeeping: it changes when the
ledger's layout on disk does, not when the fleet's protocol does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ledger import IntegrityError, session_dir_for
from ledger.entries import SealedLine
from ledger.heads import HEADS_DIR
from ledger.session import SessionLedgers
from supervisor.turns.context import now_us

__all__ = ["adopted_as", "move_aside", "rebuild_ledgers"]


def adopted_as(*, ledger_lines: int, written: int, forked: bool) -> str:
    """How a session came to be homed here, for `session_adopted`: ``"restart"`` when this
    root already held the session's ledger files, in agreement with the store (a prefix of
    its lines, perhaps all: the daemon started again on the root that homed it, and at most
    caught up what its crash kept from the files), ``"takeover"`` when they had to be written
    from the store (another daemon's session) or this root's copy had forked and was moved
    aside."""
    kept_here = ledger_lines > 0 and written < ledger_lines
    return "restart" if kept_here and not forked else "takeover"


def rebuild_ledgers(
    root: Path, tier: str, session_id: str, lines: Sequence[SealedLine]
) -> tuple[int, bool]:
    """Bring the session's ledger files on *root* to the store's *lines*; returns the lines
    written and whether this root's copy had forked (and was moved aside). Blocking: run it
    on a worker thread."""
    try:
        return SessionLedgers.adopt(root=root, tier=tier, session_id=session_id, lines=lines), False
    except IntegrityError:  # this host's files went on past the store: a stale fork
        move_aside(root, tier, session_id)
        return SessionLedgers.adopt(root=root, tier=tier, session_id=session_id, lines=lines), True


def move_aside(root: Path, tier: str, session_id: str) -> None:
    """Keep this host's copy of a session's files out of the way (`<root>/planes/<tier>/stale/`):
    another daemon appended to the chain meanwhile. Their anchored heads go with them (to the
    same place under `<root>/state/ledger-heads/`): a later takeover rebuilds the files from
    the store, and must not find an anchor of the old copy saying they were truncated."""
    stamp = f"{session_id}-{now_us()}"
    session_dir = session_dir_for(root, tier, session_id)
    heads = root.joinpath(*HEADS_DIR).joinpath(session_dir.relative_to(root))
    for found, stale_dir in (
        (session_dir, session_dir.parent.parent / "stale"),
        (heads, heads.parent.parent / "stale"),
    ):
        if found.exists():
            stale_dir.mkdir(parents=True, exist_ok=True)
            found.rename(stale_dir / stamp)
