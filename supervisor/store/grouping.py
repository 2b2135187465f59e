"""How a committer's batch runs as groups: its accepts at once, its other writes in order, its
endings at once (both engines; pure, no I/O).

Under load a batch holds dozens of accepts and endings of different turns. Each engine can
write a group of them with a few statements (SQLite: one ``executemany`` per step, see
`supervisor.store.sqlite.batches`; PostgreSQL: one statement for all accepts and one for all
endings, see `supervisor.store.postgres.many`) instead of a few statements each. Running the
accepts first and the endings last changes the order of the batch's writes, which is allowed
only when no write of the batch depends on another's place; `plan` says when, and each
engine's committer runs the batch op by op, in order, when it is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from sandbox.policy.attempt_record import AttemptRecord
from supervisor.store.protocol import Claim, NewTurn, TurnEnding
from supervisor.store.sealing import LineSeal

__all__ = ["NEW_TURN", "Accept", "Finish", "Groupable", "Plan", "plan"]

#: `Groupable.touches` of an op that writes only a turn it creates (an accept)
NEW_TURN: Final = -1


@dataclass(frozen=True, slots=True)
class Accept:
    """One queued accept of a turn without an idempotency key (`TurnStore.accept`)."""

    new: NewTurn
    claim_for: str | None
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Finish:
    """One queued ending: the arguments of `TurnStore.finish`."""

    claim: Claim
    ending: TurnEnding
    attempts: tuple[AttemptRecord, ...]
    #: the ending's ledger lines, sealed by the engine once the fence held
    lines: LineSeal
    started: AttemptRecord | None


class Groupable(Protocol):
    """What the plan reads of a queued op."""

    @property
    def accept(self) -> Accept | None: ...

    @property
    def finish(self) -> Finish | None: ...

    @property
    def touches(self) -> int | None: ...


OpT = TypeVar("OpT", bound=Groupable)


@dataclass(frozen=True, slots=True)
class Plan(Generic[OpT]):
    """A batch as groups: run *accepts* at once, then *others* one by one in order, then
    *endings* at once."""

    accepts: list[OpT]
    others: list[OpT]
    endings: list[OpT]


def plan(batch: Sequence[OpT]) -> Plan[OpT] | None:
    """The batch as groups when that order is allowed: every other op names the one turn it
    writes (a start, a retry) or writes only a turn it creates (an accept with an idempotency
    key), no op writes a turn after its ending, the endings are of distinct turns; and there
    are at least two accepts or two endings to group. None: run the batch op by op, in order."""
    accepts: list[OpT] = []
    endings: list[OpT] = []
    others: list[OpT] = []
    ended: set[int] = set()
    for op in batch:
        if op.accept is not None:
            accepts.append(op)
        elif (finish := op.finish) is not None:
            turn_id = finish.claim.turn_id
            if turn_id in ended:
                return None
            ended.add(turn_id)
            endings.append(op)
        elif op.touches is None or op.touches in ended:
            return None
        else:
            others.append(op)
    if len(accepts) < 2 and len(endings) < 2:
        return None
    return Plan(accepts, others, endings)
