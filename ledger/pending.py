"""Entries checked but not yet sealed: a turn's lines waiting for the commit that decides them.

A turn's exec and evidence entries get their place in the chain (``seq``, ``previous_hash``)
only once the caller's store has checked that the ending may be recorded (its fence held), in
the transaction that commits it: the store calls `PendingLines.seal` there. A refused ending is
never sealed, so it never takes a seq that later lines would chain onto. Should the transaction
fail after sealing, `withdraw` takes the lines back out of the chain (they are still held out of
the files, `LedgerWriter.seal_prepared`); a rerun of the transaction seals them again.

The records are normalized and validated when the object is made (`LedgerWriter.prepare`), so a
bad record is the caller's error at once, never the store's in the middle of a commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ledger.entries import SealedLine
from ledger.writer import LedgerWriter

__all__ = ["PendingLines"]


class PendingLines:
    """Prepared records for one or more ledgers, sealed (held) on `seal`, taken back on
    `withdraw`. Thread-safe as the writers are; one caller seals and withdraws at a time."""

    __slots__ = ("_items", "lines")

    def __init__(self, items: Sequence[tuple[LedgerWriter, dict[str, object]]]) -> None:
        #: (writer, prepared fields) in the order the lines are sealed
        self._items = tuple(items)
        #: the sealed lines while sealed (empty before `seal` and after `withdraw`)
        self.lines: tuple[SealedLine, ...] = ()

    @property
    def ledger_ids(self) -> tuple[str, ...]:
        """The ledgers the lines go to (known before sealing: a store locks their sessions)."""
        return tuple(writer.ledger_id for writer, _ in self._items)

    def add_fields(self, ledger_suffix: str, extra: Mapping[str, object]) -> None:
        """Add *extra* fields to the prepared record of each ledger whose id ends with
        ``/<ledger_suffix>`` (before `seal` only: the fields are hashed with the rest); a field
        the record already has is left as it is."""
        if self.lines:
            raise RuntimeError("the lines are sealed: nothing can be added to them")
        for writer, fields in self._items:
            if writer.ledger_id.endswith(f"/{ledger_suffix}"):
                for key, value in extra.items():
                    fields.setdefault(key, value)

    def seal(self) -> tuple[SealedLine, ...]:
        """Seal every line at the head of its ledger, held out of the file until released;
        the same lines again when already sealed."""
        if self.lines:
            return self.lines
        sealed: list[SealedLine] = []
        try:
            for writer, fields in self._items:
                sealed.append(writer.seal_prepared(dict(fields), hold=True)[1])
        except BaseException:
            self._take_back(sealed)
            raise
        self.lines = tuple(sealed)
        return self.lines

    def withdraw(self) -> None:
        """The commit that held the sealed lines did not happen: take them back out of their
        chains (last first). No-op when not sealed."""
        lines, self.lines = self.lines, ()
        self._take_back(list(lines))

    def _take_back(self, sealed: list[SealedLine]) -> None:
        writers = {writer.ledger_id: writer for writer, _ in self._items}
        for line in reversed(sealed):
            writers[line.ledger_id].withdraw((line.seq,))
