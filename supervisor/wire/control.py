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

Layout: this module holds the requests' envelope (one struct per operation, ``op`` its tag),
the union of them and its decoding, and re-exports every name of the pieces it is made of: the
field types (`supervisor.wire.control_fields`), the params of each operation
(`supervisor.wire.control_params`), and the decode errors with what to do per field
(`supervisor.wire.control_errors`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

import msgspec
from msgspec import Struct

from supervisor.wire.control_errors import HINTS, FieldProblem, RequestDecodeError
from supervisor.wire.control_fields import (
    EVIDENCE_CHUNK_MAX,
    MAX_TURN_ID,
    RequestId,
    TurnAnswer,
    WaitAnswer,
)
from supervisor.wire.control_params import (
    DeclaredOutputParam,
    DrainParams,
    EscalationResolveParams,
    EscalationsListParams,
    EventsSubscribeParams,
    EventsUnsubscribeParams,
    ExecutorsListParams,
    ExecutorsWaitParams,
    NoParams,
    SessionFilter,
    SessionOpenParams,
    SessionRef,
    TurnCancelParams,
    TurnEvidenceParams,
    TurnRef,
    TurnsListParams,
    TurnSubmitParams,
    TurnWaitParams,
)
from supervisor.wire.frames import FrameDecodeError, undecodable

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
    "WaitAnswer",
    "convert_request",
    "decode_request",
    "op_of",
]

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


class ExecutorsList(_Request, frozen=True, tag="executors.list"):
    params: ExecutorsListParams = ExecutorsListParams()


class ExecutorsWait(_Request, frozen=True, tag="executors.wait"):
    params: ExecutorsWaitParams


class EscalationsList(_Request, frozen=True, tag="escalations.list"):
    params: EscalationsListParams = EscalationsListParams()


class EscalationsResolve(_Request, frozen=True, tag="escalations.resolve"):
    params: EscalationResolveParams


class LedgerVerify(_Request, frozen=True, tag="ledger.verify"):
    params: SessionFilter = SessionFilter()


class Drain(_Request, frozen=True, tag="drain"):
    params: DrainParams = DrainParams()


class EventsSubscribe(_Request, frozen=True, tag="events.subscribe"):
    params: EventsSubscribeParams = EventsSubscribeParams()


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


def _field_of(path: str) -> str:
    """``.params.declared_outputs[0].role`` -> ``declared_outputs[0].role``."""
    path = path.removeprefix(".")
    return path.removeprefix("params.") if path != "params" else "params"


def _explain(exc: msgspec.ValidationError, read_id: Callable[[], RequestId]) -> Exception:
    cause = exc.__cause__
    request_id: RequestId = None
    if not isinstance(cause, FieldProblem):
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
    if isinstance(cause, FieldProblem):
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
    hint = HINTS.get(re.split(r"[.\[]", field_name, maxsplit=1)[0])
    message = f"{field_name}: {problem}" + (f"; {hint}" if hint else "")
    return RequestDecodeError("bad_request", message, field=field_name, request_id=request_id)
