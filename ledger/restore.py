"""Checking a line that a store kept before the writer puts it back into the file it left.

A daemon whose store commits a turn's lines with its final state may crash before the file was
synced; on restart the store still has the lines and the file does not (`LedgerWriter.restore`).
A line goes back only if it is exactly the sealed entry and continues the file's chain: a gap,
another ledger's line, a different previous hash or bytes that are not the sealed entry mean the
store and the file disagree, which is tampering, not a crash (`IntegrityError`).
"""

from __future__ import annotations

from pathlib import Path

from ledger.canonical import decode
from ledger.chain import seal
from ledger.entries import SealedLine
from ledger.errors import IntegrityError

__all__ = ["restorable"]


def restorable(
    sealed: SealedLine, *, path: Path, ledger_id: str, head: tuple[int, str]
) -> dict[str, object] | None:
    """The entry of *sealed* (without its ``entry_hash``) when it may follow *head*, the
    ``(seq, entry_hash)`` the ledger *path* ends at; None when the file already holds it (its
    ``seq`` is at or below the head's). Raises `IntegrityError` for a line that does neither."""
    head_seq, head_hash = head
    if sealed.seq == head_seq and sealed.entry_hash != head_hash:
        msg = f"the file holds another line at seq {sealed.seq} (a forked chain)"
        raise IntegrityError(path, 0, sealed.seq, msg)
    if sealed.seq <= head_seq:
        return None

    def refuse(reason: str) -> IntegrityError:
        return IntegrityError(path, 0, sealed.seq, f"the store's line cannot be restored: {reason}")

    if sealed.ledger_id != ledger_id:
        raise refuse(f"it belongs to ledger {sealed.ledger_id!r}")
    if sealed.seq != head_seq + 1:
        raise refuse(f"the file ends at seq {head_seq} (a gap)")
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
    if fields.get("previous_hash") != head_hash or fields.get("seq") != sealed.seq:
        raise refuse("it does not link to the file's last entry")
    return fields
