"""The `TurnStore` seam: the only way the turn core reaches durable state.

No SQL, no connection or thread objects cross this seam; only the frozen records below. Two
engines fill it: SQLite (embedded default, one daemon) and PostgreSQL (several daemons on several
hosts). One conformance suite (`tests/supervisor/store/conformance.py`) tests every rule once and
runs against each engine.

Ownership, written for the shared engine and kept by the embedded one:

* A daemon works on a turn only while it holds a **claim**: an owner id, a lease expiry and a
  fencing **token** that only grows (each new claim of a turn takes a larger token). `accept`
  can claim the new turn at once (the accepting daemon runs it; no polling on the hot path);
  `claim` takes runnable turns nobody holds; `recover` takes back what this owner held before a
  restart, and on a shared engine also turns whose lease expired.
* Every write made under a claim (`start_attempt`, `record_attempt`, `finish`) is **fenced**: if
  the turn's token is no longer the claim's token (the lease expired and another daemon claimed
  it), the write is refused with `StaleClaimError` and nothing changes. So a daemon paused past
  its lease can never record a second result.
* Every state change is checked against the lifecycle table (`sandbox.policy.lifecycle`); an
  illegal one raises `IllegalTransition` naming both states and changes nothing.
* `finish` with a final state or ``escalated`` releases the claim. Escalated turns are resolved
  by anyone (`resolve_escalation`): retry puts the turn back to ``accepted`` with a fresh attempt
  budget (claimable again), terminate and cancel end it.
* Acceptance is idempotent per ``(session_id, idempotency_key)``: a resubmission returns the
  first turn with ``created=False`` and writes nothing.
* Every method returns only after its change is durable.
* **A turn's durable step.** `finish` takes the turn's ledger lines (exec and evidence), seals
  them once the ending's fence has held (`supervisor.store.sealing`) and commits them with the
  ending in one transaction: a refused ending never takes a seq; the turn is never final without its
  entries, and never has entries without being final. The JSONL files are written from the
  lines and synced later in rounds; `trim_ledger_lines` drops what the files hold durably, and
  after a crash `ledger_lines` gives back what they may have lost.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES, TurnKind, TurnState
from supervisor.store.sealing import LineSeal
from supervisor.wire.turn_spec import TurnSpec, spec_to_dict

__all__ = [
    "RESOLUTION_REASONS",
    "Accepted",
    "Claim",
    "ClaimFilter",
    "NewSession",
    "NewTurn",
    "PendingWrite",
    "Resolution",
    "SessionRecord",
    "SessionState",
    "StoreStatistics",
    "TurnEnding",
    "TurnPage",
    "TurnRecord",
    "TurnStore",
]


class SessionState(enum.StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class Resolution(enum.StrEnum):
    """What a person (or a client) decides for an escalated turn."""

    RETRY = "retry"
    TERMINATE = "terminate"
    CANCEL = "cancel"


#: The reason code and reason every engine records when a resolution ends a turn.
RESOLUTION_REASONS: Mapping[Resolution, tuple[str, str]] = MappingProxyType(
    {
        Resolution.TERMINATE: ("OPERATOR_TERMINATED", "an operator terminated the escalated turn"),
        Resolution.CANCEL: ("CANCELLED_BY_CLIENT", "cancelled through the control API"),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewSession:
    session_id: str
    package_id: str
    tier: str = "default"
    work_order_id: str | None = None
    workspace: str | None = None
    #: the tenant label its turns queue under (None: the session is its own tenant)
    tenant: str | None = None
    #: its weight among tenants when turns wait for a slot (None: 1)
    priority: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    session_id: str
    package_id: str
    tier: str
    work_order_id: str | None
    workspace: str | None
    state: SessionState
    opened_us: int
    closed_us: int | None
    #: turns accepted in this session so far (the next turn number is ``turns + 1``)
    turns: int
    tenant: str | None = None
    priority: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "package_id": self.package_id,
            "tier": self.tier,
            "work_order_id": self.work_order_id,
            "workspace": self.workspace,
            "state": self.state.value,
            "opened_us": self.opened_us,
            "closed_us": self.closed_us,
            "turns": self.turns,
            "tenant": self.tenant,
            "priority": self.priority,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTurn:
    session_id: str
    #: the checked turn (`supervisor.turns.requests.turn_request`), kept encoded
    spec: TurnSpec
    idempotency_key: str | None = None

    @property
    def kind(self) -> TurnKind:
        return self.spec.kind


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    turn_id: int
    session_id: str
    turn_number: int
    kind: TurnKind
    spec: TurnSpec
    idempotency_key: str | None
    state: TurnState
    #: the number of the current (or last) attempt; 0 before the first
    attempt: int
    accepted_us: int
    updated_us: int
    next_attempt_us: int | None = None
    finished_us: int | None = None
    verdict: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    fault_type: str | None = None
    result: Mapping[str, object] | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    #: the daemon holding the turn's claim, if any, and the turn's current fencing token
    owner: str | None = None
    token: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def to_dict(self) -> dict[str, object]:
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "kind": self.kind.value,
            "spec": spec_to_dict(self.spec),
            "idempotency_key": self.idempotency_key,
            "state": self.state.value,
            "final": self.final,
            "attempt": self.attempt,
            "accepted_us": self.accepted_us,
            "updated_us": self.updated_us,
            "next_attempt_us": self.next_attempt_us,
            "finished_us": self.finished_us,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "fault_type": self.fault_type,
            "result": dict(self.result) if self.result is not None else None,
            "attempts": [a.to_dict() for a in self.attempts],
            "owner": self.owner,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A daemon's right to work on one turn until ``lease_until_us``, proven by ``token``."""

    turn: TurnRecord
    owner: str
    token: int
    lease_until_us: int

    @property
    def turn_id(self) -> int:
        return self.turn.turn_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    turn: TurnRecord
    #: False when the idempotency key was seen before: ``turn`` is that first turn
    created: bool
    #: the claim taken together with the acceptance (``claim_for``), when created
    claim: Claim | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimFilter:
    """Which runnable turns a daemon can take: instruction turns only for command types its
    executors support, process turns only for sessions whose sandbox it can run, and (a daemon
    in a fleet) turns of any kind only of the sessions it homes. ``None`` means any."""

    command_types: frozenset[str] | None = None
    process_sessions: frozenset[str] | None = None
    sessions: frozenset[str] | None = None
    kinds: frozenset[TurnKind] = frozenset(TurnKind)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnding:
    """How a turn ends (or is parked): the state and the decision that led there."""

    state: TurnState
    verdict: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    fault_type: str | None = None
    result: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnPage:
    turns: tuple[TurnRecord, ...]
    #: pass as ``after_turn_id`` for the next page; None when this was the last page
    next_after: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatistics:
    engine: str
    commits: int
    operations: int
    largest_batch: int
    stale_writes_refused: int
    #: False while the store's server cannot be reached (writes wait; see the engine)
    available: bool = True
    #: times the server became unreachable since start, and the last error seen
    outages: int = 0
    last_error: str = ""
    #: statements sent to a database server (PostgreSQL; 0 for the embedded engine)
    round_trips: int = 0


T_co = TypeVar("T_co", covariant=True)


class PendingWrite(Protocol[T_co]):
    """A write queued by a ``*_soon`` method: it commits in order with the store's other
    writes; `result` waits for its commit and returns (or raises) what the write did. Without
    a task: `when_done` calls back once the store is done with it (committed or failed), and
    `outcome` then returns (or raises) the same as `result`."""

    async def result(self) -> T_co: ...

    def when_done(self, callback: Callable[[], None]) -> None: ...

    def outcome(self) -> T_co: ...


class TurnStore(Protocol):
    """Durable sessions, turns, attempts, claims and escalations (see the module docstring)."""

    # -- sessions
    async def open_session(self, new: NewSession) -> SessionRecord:
        """Record a new open session (a duplicate id raises `ValueError`)."""
        ...

    async def close_session(self, session_id: str) -> SessionRecord:
        """Close it (`UnknownSessionError` if absent; closing a closed one is a no-op)."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord:
        """`UnknownSessionError` if absent."""
        ...

    async def list_sessions(self, *, state: SessionState | None = None) -> list[SessionRecord]: ...

    # -- acceptance and claims
    async def accept(
        self, new: NewTurn, *, claim_for: str | None = None, lease_ms: int = 30_000
    ) -> Accepted:
        """Durably accept a turn (idempotent), optionally claiming it for ``claim_for``.

        `UnknownSessionError` for an unknown session, `SessionClosedError` for a closed one.
        """
        ...

    def accept_soon(
        self, new: NewTurn, *, claim_for: str | None = None, lease_ms: int = 30_000
    ) -> PendingWrite[Accepted]:
        """`accept`, queued without waiting: the submissions of one pass of the turn core are
        queued together and commit in one transaction."""
        ...

    async def find_turn(self, session_id: str, idempotency_key: str) -> TurnRecord | None: ...

    async def claim(
        self, owner: str, *, limit: int, lease_ms: int, only: ClaimFilter | None = None
    ) -> list[Claim]:
        """Claim up to *limit* runnable turns held by nobody: ``accepted``, ``waiting_retry``
        whose backoff has passed, and any unfinished turn whose lease expired (an interrupted
        attempt: the claimer records it as a CRASH). Oldest first."""
        ...

    async def renew(self, claims: Sequence[Claim], *, lease_ms: int) -> list[Claim]:
        """Extend the leases still held; the claims lost meanwhile are left out of the answer."""
        ...

    async def release(self, claim: Claim) -> None:
        """Give the turn up without changing its state (drain): another daemon may claim it."""
        ...

    async def recover(self, owner: str, *, lease_ms: int) -> list[Claim]:
        """Claim again every unfinished, non-escalated turn *owner* held before a restart
        (the embedded engine: every unfinished, non-escalated turn)."""
        ...

    # -- fenced writes
    async def start_attempt(self, claim: Claim, attempt: AttemptRecord) -> Claim:
        """Move the turn to ``running`` with *attempt* as its current attempt."""
        ...

    def start_attempt_soon(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        on_commit: Callable[[Claim], None] | None = None,
    ) -> PendingWrite[Claim]:
        """`start_attempt`, queued without waiting: the attempt can be dispatched while the
        start commits. Every later write of this daemon commits after it. *on_commit* runs on
        the event loop as soon as the start is durable (not when it is refused)."""
        ...

    async def record_attempt(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        next_attempt_us: int,
        started: AttemptRecord | None = None,
    ) -> Claim:
        """Record a decided attempt whose verdict is RETRY: the turn waits until
        *next_attempt_us* (``waiting_retry``); the claim stays held. *started*: the attempt's
        start, not written before, is written first in the same transaction (as by
        `start_attempt`)."""
        ...

    async def finish(
        self,
        claim: Claim,
        ending: TurnEnding,
        attempts: Sequence[AttemptRecord] = (),
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        started: AttemptRecord | None = None,
    ) -> TurnRecord:
        """Record *attempts* and move the turn to ``ending.state`` (final or ``escalated``);
        releases the claim. *ledger_lines* commit in the same transaction; a `LineSeal` is
        sealed there only once the fence has held (`supervisor.store.sealing`), and withdrawn
        if the transaction fails. A line must continue its chain: a line kept before under the
        same ledger and seq must be the same line, else `ValueError`. So does *started*, an
        attempt start not written before (as by `start_attempt`), commit with it."""
        ...

    def record_attempt_soon(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        next_attempt_us: int,
        started: AttemptRecord | None = None,
    ) -> PendingWrite[Claim]:
        """`record_attempt`, queued without waiting (a retry decided without a task)."""
        ...

    def finish_soon(
        self,
        claim: Claim,
        ending: TurnEnding,
        attempts: Sequence[AttemptRecord] = (),
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        started: AttemptRecord | None = None,
    ) -> PendingWrite[TurnRecord]:
        """`finish`, queued without waiting: the endings of one pass of the turn core are
        queued together and commit in one transaction (the caller waits on them all at once)."""
        ...

    # -- ledger lines
    async def ledger_lines(self, ledger_ids: Sequence[str]) -> list[SealedLine]:
        """The kept lines of these ledgers, in (ledger, seq) order."""
        ...

    @property
    def keeps_ledgers(self) -> bool:
        """True when the store is the ledger of record (a shared engine): it keeps every line
        and `trim_ledger_lines` drops nothing."""
        ...

    async def trim_ledger_lines(self, synced: Mapping[str, int]) -> int:
        """Drop the kept lines up to each ledger's seq in *synced* (its file holds them
        durably); how many were dropped (always 0 when `keeps_ledgers`)."""
        ...

    # -- escalations
    async def resolve_escalation(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        result: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        """An escalated turn: RETRY -> ``accepted`` (attempt budget restarts), TERMINATE ->
        ``terminated``, CANCEL -> ``cancelled``. `NotEscalatedError` when it is not parked.
        *ledger_lines* (the ending's entries) commit in the same transaction. *result*, when
        given, is the turn's result from now on (it carries who decided, ``decided_by``);
        without it an ending keeps the parked turn's result and a retry has none."""
        ...

    # -- reads
    async def get_turn(self, turn_id: int) -> TurnRecord:
        """`UnknownTurnError` if absent."""
        ...

    async def list_turns(
        self,
        *,
        session_id: str | None = None,
        states: frozenset[TurnState] | None = None,
        package_id: str | None = None,
        accepted_since_us: int | None = None,
        accepted_until_us: int | None = None,
        after_turn_id: int = 0,
        limit: int = 500,
    ) -> TurnPage:
        """A page of turns after *after_turn_id*, oldest first, of those the filters keep (each
        optional, all given ones hold; `supervisor.store.turn_filter.TurnFilter`): of one
        session, in one of *states*, of the sessions of *package_id*, accepted at or after
        *accepted_since_us* and before *accepted_until_us*."""
        ...

    async def counts(self) -> dict[str, int]:
        """Turns by state value."""
        ...

    def statistics(self) -> StoreStatistics: ...

    async def aclose(self) -> None: ...
