"""A turn's ledger lines as an ending carries them to the store: sealed only after the fence.

An ending's exec and evidence lines take their place in their chains (``seq``,
``previous_hash``) inside the transaction that commits the ending, and only once its fence has
held (owner, claim token, legal move, session home): the engine calls `LineSeal.seal` there. A
refused ending is never sealed, so no later line chains onto it and nothing has to reach a file
or the store to be undone. When the transaction fails after sealing (rolled back, rerun after a
lost connection or a lock timeout), the engine calls `withdraw_all`, which takes the lines back
(last sealed first); a rerun seals them again (`ledger.pending.PendingLines`).

Lines sealed elsewhere before (a caller's test data, the violation entries a process turn wrote
to the files itself) travel as `Presealed`: there is nothing to take back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, cast

from ledger.entries import SealedLine

__all__ = [
    "EMPTY",
    "Chained",
    "LineSeal",
    "Presealed",
    "as_seal",
    "sessions_of",
    "withdraw_all",
]


class LineSeal(Protocol):
    """An ending's ledger lines, sealed by the store once the ending may be recorded."""

    @property
    def ledger_ids(self) -> tuple[str, ...]:
        """The ledgers the lines go to (known before sealing: the store locks their sessions)."""
        ...

    @property
    def lines(self) -> tuple[SealedLine, ...]:
        """The sealed lines (empty before `seal` and after `withdraw`)."""
        ...

    def seal(self) -> tuple[SealedLine, ...]:
        """Give the lines their place in their chains; the same lines again when sealed."""
        ...

    def withdraw(self) -> None:
        """The transaction that held the sealed lines did not commit: take them back."""
        ...


class Presealed:
    """Lines sealed before the store saw them (nothing to take back on a rollback)."""

    __slots__ = ("lines",)

    def __init__(self, lines: Iterable[SealedLine] = ()) -> None:
        self.lines = tuple(lines)

    @property
    def ledger_ids(self) -> tuple[str, ...]:
        return tuple(x.ledger_id for x in self.lines)

    def seal(self) -> tuple[SealedLine, ...]:
        return self.lines

    def withdraw(self) -> None:
        return None


class Chained:
    """Lines already in the files (*first*: a process turn's violation entries, anchored with
    its ending in a fleet) followed by the ending's own lines, sealed after the fence."""

    __slots__ = ("_first", "_then")

    def __init__(self, first: Sequence[SealedLine], then: LineSeal) -> None:
        self._first = tuple(first)
        self._then = then

    @property
    def ledger_ids(self) -> tuple[str, ...]:
        return (*(x.ledger_id for x in self._first), *self._then.ledger_ids)

    @property
    def lines(self) -> tuple[SealedLine, ...]:
        then = self._then.lines
        return (*self._first, *then) if then else ()

    def seal(self) -> tuple[SealedLine, ...]:
        return (*self._first, *self._then.seal())

    def withdraw(self) -> None:
        self._then.withdraw()


EMPTY = Presealed()


def as_seal(lines: Sequence[SealedLine] | LineSeal) -> LineSeal:
    """*lines* as a `LineSeal` (sealed lines are `Presealed`)."""
    if isinstance(lines, (tuple, list)):
        return Presealed(lines) if lines else EMPTY
    # not an isinstance() of the Protocol: that walks its members at every ending (the typing
    # module's runtime check), a cost on the hot path for what the type checker proves
    return cast("LineSeal", lines)


def sessions_of(ledger_ids: Iterable[str]) -> list[str]:
    """The sessions of these ledgers (``<sid>/exec``, ``<sid>/evidence``), sorted: the order
    their rows lock in."""
    return sorted({ledger_id.rsplit("/", 1)[0] for ledger_id in ledger_ids})


def withdraw_all(seals: Iterable[LineSeal | None]) -> None:
    """Take back the lines of a batch whose transaction failed, last sealed first (a line can
    leave its chain only from the end). A ledger that cannot take them back fails (logged by
    the ledger); the others still do."""
    for seal in reversed(list(seals)):
        if seal is None or not seal.lines:
            continue
        try:
            seal.withdraw()
        except Exception:  # the ledger failed itself and says why; the batch's error stands
            continue
