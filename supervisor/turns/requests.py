"""Submitted turns, checked once: ``turn.submit``'s decoded params become a typed `TurnSpec`.

msgspec has already checked every type and bound when the control frame was decoded
(`supervisor.wire.control.TurnSubmitParams`); `turn_request` applies the rules no type can say
(the declaration rules of FR-RT-013, the Phase-20 envelope rules, which fields each kind needs)
and builds the spec the store keeps (`supervisor.wire.turn_spec`). Every refusal is a
`RequestError` naming the field and what to do.

`idempotency_conflict` is the rule of a reused idempotency key: a resubmission with the same
key gets the first turn back only if it asks for the same turn (the same spec, its trace
context aside); else it is refused, naming the key, that turn and the fields that differ.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final

import msgspec
from msgspec import UNSET, UnsetType

from sandbox.policy.declarations import DeclarationProblem, DeclaredOutput, parse_declared_outputs
from sandbox.policy.errors import InstructionError
from sandbox.policy.lifecycle import TurnKind
from sandbox.policy.safety import build_executor_instruction
from supervisor.errors import RequestError
from supervisor.store.protocol import TurnRecord
from supervisor.traces import parse_traceparent
from supervisor.wire.control import TurnSubmitParams
from supervisor.wire.turn_spec import (
    InstructionSpec,
    ProcessSpec,
    RequestedBy,
    TurnSpec,
    spec_to_dict,
)

__all__ = [
    "DeclaredOutput",
    "InstructionSpec",
    "ProcessSpec",
    "TurnRequest",
    "TurnSpec",
    "idempotency_conflict",
    "iso_now",
    "spec_differences",
    "turn_request",
]


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One submitted turn, checked: where it goes, what it is, and its idempotency key."""

    session_id: str
    spec: TurnSpec
    idempotency_key: str | None = None

    @property
    def kind(self) -> TurnKind:
        return self.spec.kind

    @property
    def instruction(self) -> InstructionSpec | None:
        return self.spec if isinstance(self.spec, InstructionSpec) else None

    @property
    def process(self) -> ProcessSpec | None:
        return self.spec if isinstance(self.spec, ProcessSpec) else None


_CHECK_TIMESTAMP: Final = "2026-01-01T00:00:00.000000Z"


def _bad(field_name: str, problem: str) -> RequestError:
    return RequestError("bad_request", f"{field_name}: {problem}", field=field_name)


def _declared_outputs(params: TurnSubmitParams) -> tuple[DeclaredOutput, ...]:
    """The one parser of ``declared_outputs`` (sandbox/policy/declarations.py), as a reply."""
    entries = [
        d if isinstance(d, str) else {"path": d.path, "role": d.role}
        for d in params.declared_outputs
    ]
    try:
        return parse_declared_outputs(entries)
    except DeclarationProblem as exc:
        raise _bad(exc.field, exc.problem) from None


def _requested_by(params: TurnSubmitParams) -> RequestedBy | UnsetType:
    """Who asked, through a front end (`hunter mcp`): kept in the spec only when given."""
    return params.requested_by if params.requested_by is not None else UNSET


def turn_request(params: TurnSubmitParams, *, default_timeout_ms: int = 30_000) -> TurnRequest:
    """The checked turn of a ``turn.submit``; raises `RequestError`.

    ``declared_outputs`` is required for both kinds (FR-RT-013, the wire type says so). An
    instruction turn's executor writes nothing on this host, so for instruction turns it must
    be the empty list.
    """
    declared = _declared_outputs(params)
    timeout_ms = params.timeout_ms if isinstance(params.timeout_ms, int) else default_timeout_ms
    traceparent = params.traceparent
    if traceparent is not None and parse_traceparent(traceparent) is None:
        raise _bad("traceparent", "must be a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>")
    spec: TurnSpec
    if params.kind is TurnKind.INSTRUCTION:
        spec = _instruction(params, declared, timeout_ms)
    else:
        argv = params.argv
        if not argv or not argv[0]:
            raise _bad(
                "argv", "must be a non-empty list of strings (the command and its arguments)"
            )
        spec = ProcessSpec(
            timeout_ms=timeout_ms,
            declared_outputs=declared,
            declared_inputs=tuple(params.declared_inputs),
            phase=params.phase,
            traceparent=traceparent,
            requested_by=_requested_by(params),
            argv=tuple(argv),
        )
    return TurnRequest(
        session_id=params.session_id, spec=spec, idempotency_key=params.idempotency_key
    )


def _instruction(
    params: TurnSubmitParams, declared: tuple[DeclaredOutput, ...], timeout_ms: int
) -> InstructionSpec:
    if declared:
        raise _bad(
            "declared_outputs",
            "must be [] for an instruction turn: executors write nothing on this host",
        )
    command = params.command_type
    if command is None:
        raise _bad(
            "command_type",
            "is required for an instruction turn (NAVIGATE, CLICK, READ, SCROLL, SCREENSHOT,"
            " EXTRACT or SHUTDOWN)",
        )
    spec = InstructionSpec(
        timeout_ms=timeout_ms,
        declared_inputs=tuple(params.declared_inputs),
        phase=params.phase,
        traceparent=params.traceparent,
        requested_by=_requested_by(params),
        command_type=command,
        target_url=params.target_url or "",
        target_selector=params.target_selector or "",
        parameters=dict(params.parameters or {}),
    )
    # The Phase-20 rules, now, so a bad instruction is refused at intake (the ids and the
    # timestamp are the attempt's, set when it is sent; any valid ones do here).
    try:
        build_executor_instruction(
            instruction_id="INS-0-1",
            execution_id="EXE-0",
            command_type=spec.command_type,
            target_url=spec.target_url,
            target_selector=spec.target_selector,
            timestamp=_CHECK_TIMESTAMP,
            timeout_ms=spec.timeout_ms,
            parameters=spec.parameters,
        )
    except InstructionError as exc:
        raise RequestError(
            "invalid_instruction",
            f"{exc.field}: {exc.reason}",
            field=exc.field,
            reason_code=exc.reason_code,
        ) from None
    return spec


_CANONICAL: Final = msgspec.json.Encoder(order="sorted")

#: Spec fields a resubmission may change: the client's trace context (a retry of the same
#: request is often a new span of the client's trace) and who asked through a front end (a
#: restarted `hunter mcp` has another pid); they say nothing of what the turn does.
_NOT_COMPARED: Final = frozenset({"traceparent", "requested_by"})


def spec_differences(first: TurnSpec, again: TurnSpec) -> list[str]:
    """The fields in which *again* asks for another turn than *first*, in the spec's order:
    top-level field names (``kind``, ``command_type``, ``timeout_ms``, ...), and
    ``parameters.<name>`` for each instruction parameter that differs. Of two kinds of turn,
    ``kind`` and the differing fields every kind has. Empty: the same turn."""
    old, new = spec_to_dict(first), spec_to_dict(again)
    fields: list[str] = []
    for name in old:
        if name not in new or name in _NOT_COMPARED or _same(old[name], new[name]):
            continue
        before, after = old[name], new[name]
        if name == "parameters" and isinstance(before, dict) and isinstance(after, dict):
            keys = [*before, *(k for k in after if k not in before)]
            fields.extend(
                f"parameters.{k}"
                for k in keys
                if k not in before or k not in after or not _same(before[k], after[k])
            )
        else:
            fields.append(name)
    return fields


def _same(a: object, b: object) -> bool:
    """Equal as JSON: ``1`` is not ``true``, and the order of an object's keys does not count."""
    return a == b and _CANONICAL.encode(a) == _CANONICAL.encode(b)


def idempotency_conflict(request: TurnRequest, first: TurnRecord) -> RequestError | None:
    """None when *request* asks for the same turn as *first*, the turn its idempotency key
    already names; else the ``idempotency_conflict`` error to answer (nothing is accepted)."""
    fields = spec_differences(first.spec, request.spec)
    if not fields:
        return None
    key = request.idempotency_key
    return RequestError(
        "idempotency_conflict",
        f"idempotency key {key!r} already names turn {first.turn_id} of session"
        f" {first.session_id}, and this request differs from it in {', '.join(fields)}: use a"
        f" new key to submit another turn, or resubmit the same payload to get turn"
        f" {first.turn_id} back",
        idempotency_key=key,
        turn_id=first.turn_id,
        session_id=first.session_id,
        fields=fields,
    )


def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
