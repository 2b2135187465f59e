"""Requests of the control API (``control.sock``), decoded into typed frozen messages in one step.

A request frame's body is ``{"id": <int|str|null>, "op": "<operation>", "params": {...}}``.
`decode_request` turns the body bytes into one frozen `msgspec.Struct` per operation (the
``op`` string is the union's tag), checking every type and constraint while it decodes: a
request that decodes is valid, and the handlers in ``supervisor.control.server`` never check a
field by hand. Anything else raises `RequestDecodeError`, which carries the stable wire ``code``
(``bad_request``, ``unknown_op`` or ``unknown_turn``), the ``field`` at fault, a message that
names the field and what to do, and the request's ``id`` when that much was readable. A body
that is not JSON, or not a JSON object, is a `FrameDecodeError` (the connection is closed, as
for any bad frame). Unknown fields in ``params`` are ignored (clients may be newer).

``docs/protocol.md`` and the server's module docstring describe the operations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field
from msgspec.structs import force_setattr

from sandbox.policy.attempts import AgentPhase
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.errors import RequestError
from supervisor.wire.frames import FrameDecodeError, undecodable
from supervisor.wire.turn_spec import RequestedBy

__all__ = [
    "EVIDENCE_CHUNK_MAX",
    "MAX_TURN_ID",
    "OPERATIONS",
    "ControlRequest",
    "DeclaredOutputParam",
    "Drain",
    "DrainParams",
    "EscalationResolveParams",
    "EscalationsList",
    "EscalationsListParams",
    "EscalationsResolve",
    "EventsSubscribe",
    "EventsSubscribeParams",
    "EventsUnsubscribe",
    "EventsUnsubscribeParams",
    "ExecutorsList",
    "ExecutorsListParams",
    "ExecutorsWait",
    "ExecutorsWaitParams",
    "LedgerVerify",
    "NoParams",
    "Ping",
    "RequestDecodeError",
    "RequestId",
    "SessionClose",
    "SessionFilter",
    "SessionGet",
    "SessionList",
    "SessionOpen",
    "SessionOpenParams",
    "SessionRef",
    "Status",
    "TurnAnswer",
    "TurnCancel",
    "TurnCancelParams",
    "TurnEvidence",
    "TurnEvidenceParams",
    "TurnGet",
    "TurnRef",
    "TurnSubmit",
    "TurnSubmitParams",
    "TurnWait",
    "TurnWaitParams",
    "TurnsList",
    "TurnsListParams",
    "convert_request",
    "decode_request",
    "op_of",
]

#: Turn ids are SQLite integer keys: positive and below 2**63.
MAX_TURN_ID: Final = 2**63 - 1
#: ``turn.evidence`` answers at most this many bytes at a time (base64: a third more), well
#: inside the default frame limit of 1 MiB
EVIDENCE_CHUNK_MAX: Final = 512 * 1024
#: Longest wait a client may ask for (one year, in seconds).
_MAX_WAIT_S: Final = 365 * 86_400.0

#: A request's id: the answer echoes it, so an integer id is a 64-bit one, which the JSON
#: encoder can write; a larger one is a bad ``id``, never an answer that cannot be sent.
RequestId: TypeAlias = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | str | None
_Id = Annotated[str, Meta(min_length=1, max_length=256)]
_Path = Annotated[str, Meta(min_length=1, max_length=4096)]
_Seconds = Annotated[float, Meta(ge=0, le=_MAX_WAIT_S)]
#: A time: microseconds since the Unix epoch.
_Micros = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Text = Annotated[str, Meta(max_length=65_536)]
#: A tenant label: letters, digits and ``. _ : @ -``, starting with a letter or digit.
_Tenant = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
]
#: Why a person decided (``escalations.resolve``, ``turn.cancel``, ``drain``): recorded with the
#: decision (`supervisor.turns.decisions`); not blank.
_Reason = Annotated[str, Meta(min_length=1, max_length=2000)]
#: Who decided, as the client names them (default: the user name of the caller's uid).
_Operator = Annotated[str, Meta(min_length=1, max_length=256)]
#: A session's weight among tenants (`supervisor.turns.fairness.MAX_PRIORITY` is the bound).
_Priority = Annotated[int, Meta(ge=1, le=10)]
#: How much of the turn an answer carries: the whole turn object, or only its outcome
#: (``supervisor.control.answers.compact_turn``: ids, state, verdict, reason code, attempt,
#: evidence hash).
TurnAnswer: TypeAlias = Literal["full", "compact"]


class RequestDecodeError(RequestError):
    """Raised when a control request does not decode: ``code`` is the stable wire code
    (``bad_request``, ``unknown_op``, ``unknown_turn``), ``field`` the parameter at fault (or
    ``id``/``op``/``params``; None when the error names no field), ``message`` says what was
    wrong and what to do, ``request_id`` is the request's id when it was readable (the answer
    carries it). ``to_wire()`` is the ``error`` object of the answer."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        request_id: RequestId = None,
        **details: object,
    ) -> None:
        if field is not None:
            details = {"field": field, **details}
        super().__init__(code, message, **details)
        self.field = field
        self.request_id = request_id


class _FieldProblem(ValueError):
    """Raised inside ``__post_init__``: msgspec keeps it as the ValidationError's cause."""

    def __init__(self, code: str, field_name: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.code = code
        self.field = field_name
        self.message = message
        self.details = details


# --- parameters ----------------------------------------------------------------------------


class NoParams(Struct, frozen=True):
    """Parameters of operations that take none (extra fields are ignored)."""


class SessionOpenParams(Struct, frozen=True):
    package_id: _Id
    tier: _Id | None = None
    work_order_id: _Id | None = None
    workspace: _Path | None = None
    #: turns of sessions with one tenant share one place in the fair order (none: its own)
    tenant: _Tenant | None = None
    #: the weight of the session's tenant in that order: 1 (the default) to 10
    priority: _Priority | None = None


class SessionRef(Struct, frozen=True):
    session_id: _Id


class SessionFilter(Struct, frozen=True):
    session_id: _Id | None = None


class TurnsListParams(Struct, frozen=True):
    """A page of turns, oldest first: those after ``after_turn_id`` (0: from the start) that
    the filters keep (each optional; the given ones all hold)."""

    session_id: _Id | None = None
    #: in any of these states
    states: Annotated[frozenset[TurnState], Meta(min_length=1)] | None = None
    #: of the sessions opened for this package
    package_id: _Id | None = None
    #: accepted at or after / before this time (microseconds since the epoch)
    accepted_since_us: _Micros | None = None
    accepted_until_us: _Micros | None = None
    after_turn_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, Meta(ge=1, le=500)] = 500


def _turn_id_value(value: int | str) -> int:
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise _FieldProblem(
                "bad_request",
                "turn_id",
                "turn_id: must be an integer turn id (see `hunter status`)",
            )
        # A number too long to be an id is "no such turn", never a conversion error.
        value = int(value) if len(value) <= 19 else MAX_TURN_ID + 1
    if not 1 <= value <= MAX_TURN_ID:
        text = str(value)
        shown = text if len(text) <= 30 else f"{text[:20]}..."
        raise _FieldProblem(
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
        raise _FieldProblem("bad_request", "reason", f"reason: is blank; {_HINTS['reason']}")
    if operator is not None and not operator.strip():
        raise _FieldProblem("bad_request", "operator", f"operator: is blank; {_HINTS['operator']}")


class TurnCancelParams(Struct, frozen=True):
    """``turn.cancel``: the turn, and the decision's ``reason`` and ``operator`` (both optional:
    programs cancel their own turns; when given they are recorded)."""

    turn_id: int | str
    reason: _Reason | None = None
    operator: _Operator | None = None

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))
        _check_decision(self.reason, self.operator)

    @property
    def id(self) -> int:
        return int(self.turn_id)


class TurnWaitParams(Struct, frozen=True):
    turn_id: int | str
    timeout_s: _Seconds | None = None
    until: frozenset[TurnState] = frozenset()
    answer: TurnAnswer = "full"

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))

    @property
    def id(self) -> int:
        return int(self.turn_id)


class DeclaredOutputParam(Struct, frozen=True):
    path: _Path
    role: str | None = None


class TurnSubmitParams(Struct, frozen=True):
    """``turn.submit``: every field typed here; the Phase-20 and declaration rules are applied
    once by ``supervisor.turns.requests.turn_request``, which builds the turn's typed spec."""

    session_id: _Id
    kind: TurnKind
    declared_outputs: list[_Path | DeclaredOutputParam]
    declared_inputs: list[_Path] = field(default_factory=list)
    phase: AgentPhase | None = None
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    timeout_ms: Annotated[int, Meta(ge=1, le=600_000)] | UnsetType = UNSET
    wait_s: _Seconds | None = None
    #: the answer's ``turn``: the whole turn object, or "compact" (only its outcome)
    answer: TurnAnswer = "full"
    command_type: ExecutorCommandType | None = None
    target_url: _Text | None = None
    target_selector: _Text | None = None
    parameters: dict[str, str | int | bool] | None = None
    argv: list[str] | None = None
    #: the client's W3C trace context: the turn's span becomes a child of it
    traceparent: (
        Annotated[str, Meta(pattern=r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")] | None
    ) = None
    #: who asked, through a front end (`hunter mcp`): kept with the turn, not compared for keys
    requested_by: RequestedBy | None = None


class ExecutorsWaitParams(Struct, frozen=True):
    executor_id: _Id
    status: ExecutorStatus | None = ExecutorStatus.READY
    timeout_s: _Seconds = 10.0


class EscalationResolveParams(Struct, frozen=True):
    """``escalations.resolve``: a person's decision, so ``reason`` is required (recorded with
    the decision, as is ``operator``: default the user name of the caller's uid)."""

    turn_id: int | str
    action: Literal["retry", "terminate"]
    reason: _Reason
    operator: _Operator | None = None

    def __post_init__(self) -> None:
        force_setattr(self, "turn_id", _turn_id_value(self.turn_id))
        _check_decision(self.reason, self.operator)

    @property
    def id(self) -> int:
        return int(self.turn_id)


class DrainParams(Struct, frozen=True):
    """``drain``: the decision's ``reason`` and ``operator`` (optional; recorded and logged)."""

    reason: _Reason | None = None
    operator: _Operator | None = None

    def __post_init__(self) -> None:
        _check_decision(self.reason, self.operator)


# --- requests (the envelope; ``op`` is the tag) ---------------------------------------------


class _Request(Struct, frozen=True, kw_only=True, tag_field="op"):
    id: RequestId = None


class Ping(_Request, frozen=True, tag="ping"):
    params: NoParams = NoParams()


class SessionOpen(_Request, frozen=True, tag="session.open"):
    params: SessionOpenParams


class SessionClose(_Request, frozen=True, tag="session.close"):
    params: SessionRef


class SessionGet(_Request, frozen=True, tag="session.get"):
    params: SessionRef


class SessionList(_Request, frozen=True, tag="session.list"):
    params: NoParams = NoParams()


class TurnSubmit(_Request, frozen=True, tag="turn.submit"):
    params: TurnSubmitParams


class TurnGet(_Request, frozen=True, tag="turn.get"):
    params: TurnRef


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


class TurnEvidence(_Request, frozen=True, tag="turn.evidence"):
    params: TurnEvidenceParams


class TurnWait(_Request, frozen=True, tag="turn.wait"):
    params: TurnWaitParams


class TurnCancel(_Request, frozen=True, tag="turn.cancel"):
    params: TurnCancelParams


class TurnsList(_Request, frozen=True, tag="turns.list"):
    params: TurnsListParams = TurnsListParams()


class Status(_Request, frozen=True, tag="status"):
    params: NoParams = NoParams()


class ExecutorsListParams(Struct, frozen=True):
    """A page of executors by id: those after ``after_executor_id`` ("" from the start)."""

    after_executor_id: Annotated[str, Meta(max_length=256)] = ""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 500


class ExecutorsList(_Request, frozen=True, tag="executors.list"):
    params: ExecutorsListParams = ExecutorsListParams()


class ExecutorsWait(_Request, frozen=True, tag="executors.wait"):
    params: ExecutorsWaitParams


class EscalationsListParams(Struct, frozen=True):
    """A page of the turns parked for an operator, by turn id: those after ``after_turn_id``."""

    after_turn_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, Meta(ge=1, le=500)] = 500


class EscalationsList(_Request, frozen=True, tag="escalations.list"):
    params: EscalationsListParams = EscalationsListParams()


class EscalationsResolve(_Request, frozen=True, tag="escalations.resolve"):
    params: EscalationResolveParams


class LedgerVerify(_Request, frozen=True, tag="ledger.verify"):
    params: SessionFilter = SessionFilter()


class Drain(_Request, frozen=True, tag="drain"):
    params: DrainParams = DrainParams()


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


class EventsSubscribe(_Request, frozen=True, tag="events.subscribe"):
    params: EventsSubscribeParams = EventsSubscribeParams()


class EventsUnsubscribeParams(Struct, frozen=True):
    """The subscription to end: the ``id`` of the ``events.subscribe`` request that began it."""

    subscription: RequestId


class EventsUnsubscribe(_Request, frozen=True, tag="events.unsubscribe"):
    params: EventsUnsubscribeParams


ControlRequest: TypeAlias = (
    Ping
    | SessionOpen
    | SessionClose
    | SessionGet
    | SessionList
    | TurnSubmit
    | TurnGet
    | TurnEvidence
    | TurnWait
    | TurnCancel
    | TurnsList
    | Status
    | ExecutorsList
    | ExecutorsWait
    | EscalationsList
    | EscalationsResolve
    | LedgerVerify
    | Drain
    | EventsSubscribe
    | EventsUnsubscribe
)

_REQUEST_TYPES: Final[tuple[type[_Request], ...]] = (
    Ping,
    SessionOpen,
    SessionClose,
    SessionGet,
    SessionList,
    TurnSubmit,
    TurnGet,
    TurnEvidence,
    TurnWait,
    TurnCancel,
    TurnsList,
    Status,
    ExecutorsList,
    ExecutorsWait,
    EscalationsList,
    EscalationsResolve,
    LedgerVerify,
    Drain,
    EventsSubscribe,
    EventsUnsubscribe,
)
_OP_OF: Final[dict[type[_Request], str]] = {t: str(t.__struct_config__.tag) for t in _REQUEST_TYPES}
#: Every operation name, sorted.
OPERATIONS: Final[tuple[str, ...]] = tuple(sorted(_OP_OF.values()))

_DECODER: Final[msgspec.json.Decoder[ControlRequest]] = msgspec.json.Decoder(ControlRequest)


class _IdOnly(Struct):
    id: RequestId = None


_ID_DECODER: Final = msgspec.json.Decoder(_IdOnly)


def op_of(request: ControlRequest) -> str:
    """The operation name of a decoded request."""
    return _OP_OF[type(request)]


def decode_request(body: bytes | bytearray | memoryview) -> ControlRequest:
    """Decode one request frame body into its typed, validated request.

    Raises `RequestDecodeError` for a request that is not valid and `FrameDecodeError` when the
    body is not a JSON object at all.
    """
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise _explain(exc, lambda: _ID_DECODER.decode(body).id) from None
    except Exception as exc:  # not JSON, not UTF-8 (UnicodeDecodeError), too deep, unforeseen
        raise undecodable(exc) from None


def convert_request(frame: Mapping[str, object]) -> ControlRequest:
    """`decode_request` for an already decoded frame (a dict); same checks and errors."""
    try:
        request: ControlRequest = msgspec.convert(frame, ControlRequest)
        return request
    except msgspec.ValidationError as exc:
        raise _explain(exc, lambda: msgspec.convert(frame, _IdOnly).id) from None


# --- errors ----------------------------------------------------------------------------------

_AT: Final = re.compile(r"^(?P<problem>.*?) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_MISSING: Final = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_TOP_TYPE: Final = re.compile(r"^Expected `object`, got `(?P<got>\w+)`$")

_STATES: Final = ", ".join(s.value for s in TurnState)
#: What to do, per field: appended to the message of a field that failed.
_HINTS: Final[Mapping[str, str]] = {
    "id": "an integer or a string that the answer will carry back",
    "op": "a string naming the operation (see `unknown_op`'s `operations`)",
    "params": "an object with the operation's parameters",
    "session_id": "open a session first: `hunter session open`; ids are 1-256 characters",
    "package_id": "the id of a package installed under <root>/installed/",
    "tier": "a non-empty tier name",
    "work_order_id": "a non-empty string",
    "workspace": "a non-empty path",
    "turn_id": "an integer turn id (see `hunter status`)",
    "kind": "'instruction' or 'process'",
    "declared_outputs": "list the files the turn writes; [] when it writes nothing",
    "declared_inputs": "a list of paths",
    "phase": "RED, GREEN, VERIFY or REFACTOR",
    "idempotency_key": "a string of 1..200 characters",
    "timeout_ms": "an integer number of milliseconds, 1..600000",
    "wait_s": f"a number of seconds, 0..{_MAX_WAIT_S:g}",
    "answer": "'full' (the whole turn, the default) or 'compact' (its outcome only)",
    "timeout_s": f"a number of seconds, 0..{_MAX_WAIT_S:g}",
    "command_type": "one of " + ", ".join(c.value for c in ExecutorCommandType),
    "target_url": "a string",
    "target_selector": "a string",
    "parameters": "an object of string/int/bool values",
    "argv": "a non-empty list of strings (the command and its arguments)",
    "until": f"a list of turn states ({_STATES})",
    "states": f"a non-empty list of turn states ({_STATES})",
    "accepted_since_us": "an integer time in microseconds since the Unix epoch",
    "accepted_until_us": "an integer time in microseconds since the Unix epoch",
    "action": "'retry' or 'terminate'",
    "reason": "say why, in words (1-2000 characters): it is recorded with the decision, who"
    " took it and when (`--reason TEXT`)",
    "operator": "the name of the person deciding (1-256 characters); default: the user name"
    " of the caller's uid",
    "executor_id": "an executor id (see `hunter executors`)",
    "status": "one of " + ", ".join(s.value for s in ExecutorStatus) + " or null",
}


def _field_of(path: str) -> str:
    """``.params.declared_outputs[0].role`` -> ``declared_outputs[0].role``."""
    path = path.removeprefix(".")
    return path.removeprefix("params.") if path != "params" else "params"


def _explain(exc: msgspec.ValidationError, read_id: Callable[[], RequestId]) -> Exception:
    cause = exc.__cause__
    request_id: RequestId = None
    if not isinstance(cause, _FieldProblem):
        text = str(exc)
        got = _TOP_TYPE.match(text)
        if got is not None:
            return FrameDecodeError(f"frame body is a JSON {got['got']}, not an object")
    try:
        request_id = read_id()
    except RecursionError:  # the body is nested too deep to read even its id
        return FrameDecodeError("frame body is JSON nested too deep")
    except msgspec.ValidationError as id_exc:
        # The id itself is bad: that is the error reported, and the answer carries no id.
        got = re.search(r", got `(\w+)`", str(id_exc))
        shown = f", got {got[1]}" if got is not None else ""
        if got is None and re.match(r"^Expected `int` [<>]=", str(id_exc)):
            shown = ", got an integer outside -2**63..2**63-1"
        return RequestDecodeError(
            "bad_request",
            f"id: must be an integer, a string or null{shown}",
            field="id",
        )
    except Exception as bad_body:  # any failure to read it is a bad frame
        # The decoder stopped at a missing field before reaching the malformed part (bad JSON,
        # a string that is not UTF-8 in the id).
        return undecodable(bad_body)
    if isinstance(cause, _FieldProblem):
        field_name = cause.field
        if cause.code == "bad_request":
            return RequestDecodeError(
                cause.code, cause.message, field=field_name, request_id=request_id
            )
        error = RequestDecodeError(cause.code, cause.message, request_id=request_id)
        error.details.update(cause.details)
        return error
    text = str(exc)
    at = _AT.match(text)
    problem, path = (at["problem"], at["path"]) if at is not None else (text, "")
    missing = _MISSING.match(problem)
    if missing is not None:
        field_name = _field_of(f"{path}.{missing['name']}")
        problem = "is required"
    else:
        field_name = _field_of(path) if path else "request"
    if field_name == "op":
        bad_tag = re.match(r"^Invalid value '(?P<op>.*)'$", problem, re.DOTALL)
        if bad_tag is not None:
            op = bad_tag["op"]
            shown = op if len(op) <= 64 else f"{op[:64]}..."
            return RequestDecodeError(
                "unknown_op",
                f"unknown operation {shown!r}; known: {', '.join(OPERATIONS)}",
                request_id=request_id,
                operations=list(OPERATIONS),
            )
    if field_name == "turn_id" and "out of range" in problem:
        return RequestDecodeError(
            "unknown_turn",
            "no turn with an id that large; ids are 1..2**63-1, see `hunter status`",
            request_id=request_id,
            turn_id="(too large)",
        )
    if problem.startswith("Expected"):
        problem = "expected" + problem[len("Expected") :]
    hint = _HINTS.get(re.split(r"[.\[]", field_name, maxsplit=1)[0])
    message = f"{field_name}: {problem}" + (f"; {hint}" if hint else "")
    return RequestDecodeError("bad_request", message, field=field_name, request_id=request_id)
