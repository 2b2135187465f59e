"""The params of the control API's operations (`supervisor.wire.control`), one frozen struct
per shape, grouped as the operations are: sessions, turns, executors, escalations, the daemon,
events. Each checks its own types and constraints while it decodes (a turn id, a decision's
reason and operator in ``__post_init__``); apart from the requests' envelope because params
change with an operation's fields, the envelope with the set of operations."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from msgspec import UNSET, Meta, Struct, UnsetType, field
from msgspec.structs import force_setattr

from sandbox.policy.attempts import AgentPhase
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.wire.control_errors import HINTS, FieldProblem
from supervisor.wire.control_fields import (
    EVIDENCE_CHUNK_MAX,
    MAX_TURN_ID,
    Id,
    Micros,
    Operator,
    Path,
    Priority,
    Reason,
    RequestId,
    Seconds,
    Tenant,
    Text,
    TurnAnswer,
    WaitAnswer,
)
from supervisor.wire.turn_spec import RequestedBy

__all__ = [
    "DeclaredOutputParam",
    "DrainParams",
    "EscalationResolveParams",
    "EscalationsListParams",
    "EventsSubscribeParams",
    "EventsUnsubscribeParams",
    "ExecutorsListParams",
    "ExecutorsWaitParams",
    "NoParams",
    "SessionFilter",
    "SessionOpenParams",
    "SessionRef",
    "TurnCancelParams",
    "TurnEvidenceParams",
    "TurnRef",
    "TurnSubmitParams",
    "TurnWaitParams",
    "TurnsListParams",
]


class NoParams(Struct, frozen=True):
    """Parameters of operations that take none (extra fields are ignored)."""


class SessionOpenParams(Struct, frozen=True):
    package_id: Id
    tier: Id | None = None
    work_order_id: Id | None = None
    workspace: Path | None = None
    #: turns of sessions with one tenant share one place in the fair order (none: its own)
    tenant: Tenant | None = None
    #: the weight of the session's tenant in that order: 1 (the default) to 10
    priority: Priority | None = None


class SessionRef(Struct, frozen=True):
    session_id: Id


class SessionFilter(Struct, frozen=True):
    session_id: Id | None = None


class TurnsListParams(Struct, frozen=True):
    """A page of turns, oldest first: those after ``after_turn_id`` (0: from the start) that
    the filters keep (each optional; the given ones all hold)."""

    session_id: Id | None = None
    #: in any of these states
    states: Annotated[frozenset[TurnState], Meta(min_length=1)] | None = None
    #: of the sessions opened for this package
    package_id: Id | None = None
    #: accepted at or after / before this time (microseconds since the epoch)
    accepted_since_us: Micros | None = None
    accepted_until_us: Micros | None = None
    after_turn_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, Meta(ge=1, le=500)] = 500


def _turn_id_value(value: int | str) -> int:
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise FieldProblem(
                "bad_request",
                "turn_id",
                "turn_id: must be an integer turn id (see `hunter status`)",
            )
        # A number too long to be an id is "no such turn", never a conversion error.
        value = int(value) if len(value) <= 19 else MAX_TURN_ID + 1
    if not 1 <= value <= MAX_TURN_ID:
        text = str(value)
        shown = text if len(text) <= 30 else f"{text[:20]}..."
        raise FieldProblem(
            "unknown_turn", "turn_id", f"no turn {shown}; see `hunter status`", turn_id=shown
        )
    return value


class TurnRef(Struct, frozen=True):
    """``{turn_id}``: an integer (or a string of digits); after decoding always an int."""

    turn_id: int | str

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))

    @property
    def id(self) -> int:
        """The turn id as an int (``turn_id`` is normalised to one at decode time)."""
        return int(self.turn_id)


def _check_decision(reason: str | None, operator: str | None) -> None:
    """A reason or an operator name that is only blanks says nothing: refused, named."""
    if reason is not None and not reason.strip():
        raise FieldProblem("bad_request", "reason", f"reason: is blank; {HINTS['reason']}")
    if operator is not None and not operator.strip():
        raise FieldProblem("bad_request", "operator", f"operator: is blank; {HINTS['operator']}")


class TurnCancelParams(Struct, frozen=True):
    """``turn.cancel``: the turn, and the decision's ``reason`` and ``operator`` (both optional:
    programs cancel their own turns; when given they are recorded)."""

    turn_id: int | str
    reason: Reason | None = None
    operator: Operator | None = None

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))
        _check_decision(self.reason, self.operator)

    @property
    def id(self) -> int:
        return int(self.turn_id)


class TurnWaitParams(Struct, frozen=True):
    turn_id: int | str
    timeout_s: Seconds | None = None
    until: frozenset[TurnState] = frozenset()
    answer: WaitAnswer = "full"

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))

    @property
    def id(self) -> int:
        return int(self.turn_id)


class DeclaredOutputParam(Struct, frozen=True):
    path: Path
    role: str | None = None


class TurnSubmitParams(Struct, frozen=True):
    """``turn.submit``: every field typed here; the Phase-20 and declaration rules are applied
    once by ``supervisor.turns.requests.turn_request``, which builds the turn's typed spec."""

    session_id: Id
    kind: TurnKind
    declared_outputs: list[Path | DeclaredOutputParam]
    declared_inputs: list[Path] = field(default_factory=list)
    phase: AgentPhase | None = None
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    timeout_ms: Annotated[int, Meta(ge=1, le=600_000)] | UnsetType = UNSET
    wait_s: Seconds | None = None
    #: the answer's ``turn``: the whole turn object, or "compact" (only its outcome)
    answer: TurnAnswer = "full"
    command_type: ExecutorCommandType | None = None
    target_url: Text | None = None
    target_selector: Text | None = None
    parameters: dict[str, str | int | bool] | None = None
    argv: list[str] | None = None
    #: the client's W3C trace context: the turn's span becomes a child of it
    traceparent: (
        Annotated[str, Meta(pattern=r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")] | None
    ) = None
    #: who asked, through a front end (`hunter mcp`): kept with the turn, not compared for keys
    requested_by: RequestedBy | None = None


class ExecutorsWaitParams(Struct, frozen=True):
    executor_id: Id
    status: ExecutorStatus | None = ExecutorStatus.READY
    timeout_s: Seconds = 10.0


class EscalationResolveParams(Struct, frozen=True):
    """``escalations.resolve``: a person's decision, so ``reason`` is required (recorded with
    the decision, as is ``operator``: default the user name of the caller's uid)."""

    turn_id: int | str
    action: Literal["retry", "terminate"]
    reason: Reason
    operator: Operator | None = None

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))
        _check_decision(self.reason, self.operator)

    @property
    def id(self) -> int:
        return int(self.turn_id)


class DrainParams(Struct, frozen=True):
    """``drain``: the decision's ``reason`` and ``operator`` (optional; recorded and logged)."""

    reason: Reason | None = None
    operator: Operator | None = None

    def __post_init__(self) -> None:
        _check_decision(self.reason, self.operator)


class TurnEvidenceParams(Struct, frozen=True):
    """``{turn_id, offset?, length?}``: a slice of the evidence bytes a turn's executor sent."""

    turn_id: int | str
    offset: Annotated[int, Meta(ge=0)] = 0
    length: Annotated[int, Meta(ge=1, le=EVIDENCE_CHUNK_MAX)] = EVIDENCE_CHUNK_MAX

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))

    @property
    def id(self) -> int:
        return int(self.turn_id)


class ExecutorsListParams(Struct, frozen=True):
    """A page of executors by id: those after ``after_executor_id`` ("" from the start)."""

    after_executor_id: Annotated[str, Meta(max_length=256)] = ""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 500


class EscalationsListParams(Struct, frozen=True):
    """A page of the turns parked for an operator, by turn id: those after ``after_turn_id``."""

    after_turn_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, Meta(ge=1, le=500)] = 500


_SessionIds: TypeAlias = Annotated[
    frozenset[Annotated[str, Meta(max_length=256)]], Meta(max_length=1000)
]
_TurnIds: TypeAlias = Annotated[frozenset[Annotated[int, Meta(ge=1)]], Meta(max_length=10_000)]


class EventsSubscribeParams(Struct, frozen=True):
    """Which changes to push (`supervisor.feed`): of these sessions, turns, kinds (absent: any),
    after this cursor (an event's ``cursor``: every later event still kept comes first)."""

    sessions: (
        Annotated[frozenset[Annotated[str, Meta(max_length=256)]], Meta(max_length=1000)] | None
    ) = None
    turns: Annotated[frozenset[Annotated[int, Meta(ge=1)]], Meta(max_length=10_000)] | None = None
    kinds: frozenset[str] | None = None
    after: Annotated[str, Meta(max_length=64)] | None = None


class EventsUnsubscribeParams(Struct, frozen=True):
    """The subscription to end: the ``id`` of the ``events.subscribe`` request that began it."""

    subscription: RequestId
