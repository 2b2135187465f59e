"""Submitted turns, validated: what `turn.submit` carries and what the store keeps as a spec.

`parse_turn_request` is the one place a turn's fields are checked (for a new submission and for a
stored spec after a restart). Every error is a `RequestError` naming the field and what to do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.policy.attempts import AgentPhase
from sandbox.policy.declarations import DeclarationProblem, DeclaredOutput, parse_declared_outputs
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.errors import InstructionError
from sandbox.policy.lifecycle import TurnKind
from sandbox.policy.safety import build_executor_instruction
from supervisor.errors import RequestError
from supervisor.traces import parse_traceparent

__all__ = [
    "DeclaredOutput",
    "InstructionSpec",
    "ProcessSpec",
    "TurnRequest",
    "iso_now",
    "parse_turn_request",
]

_MAX_TIMEOUT_MS = 600_000


@dataclass(frozen=True, slots=True)
class InstructionSpec:
    command_type: ExecutorCommandType
    timeout_ms: int
    target_url: str = ""
    target_selector: str = ""
    parameters: Mapping[str, str | int | bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    argv: tuple[str, ...]
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One submitted turn, validated. ``to_spec`` is what the intake stores."""

    session_id: str
    kind: TurnKind
    declared_outputs: tuple[DeclaredOutput, ...]
    declared_inputs: tuple[str, ...] = ()
    phase: AgentPhase | None = None
    idempotency_key: str | None = None
    instruction: InstructionSpec | None = None
    process: ProcessSpec | None = None
    #: the client's W3C trace context (`supervisor.traces`), kept with the turn
    traceparent: str | None = None

    def to_spec(self) -> dict[str, object]:
        spec: dict[str, object] = {
            "kind": self.kind.value,
            "declared_outputs": [d.to_wire() for d in self.declared_outputs],
            "declared_inputs": list(self.declared_inputs),
            "phase": self.phase.value if self.phase is not None else None,
        }
        if self.instruction is not None:
            spec.update(
                command_type=self.instruction.command_type.value,
                target_url=self.instruction.target_url,
                target_selector=self.instruction.target_selector,
                timeout_ms=self.instruction.timeout_ms,
                parameters=dict(self.instruction.parameters),
            )
        if self.process is not None:
            spec.update(argv=list(self.process.argv), timeout_ms=self.process.timeout_ms)
        if self.traceparent is not None:
            spec["traceparent"] = self.traceparent
        return spec


def _bad(field_name: str, problem: str) -> RequestError:
    return RequestError("bad_request", f"{field_name}: {problem}", field=field_name)


def _opt_str(params: Mapping[str, Any], key: str, *, default: str | None = None) -> str | None:
    value = params.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(key, f"must be a string, got {type(value).__name__}")
    return value


def _timeout(params: Mapping[str, Any], default_ms: int) -> int:
    value = params.get("timeout_ms", default_ms)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("timeout_ms", "must be an integer number of milliseconds")
    if not 1 <= value <= _MAX_TIMEOUT_MS:
        raise _bad("timeout_ms", f"must be between 1 and {_MAX_TIMEOUT_MS}, got {value}")
    return value


def _declared_outputs(value: object) -> tuple[DeclaredOutput, ...]:
    """The one parser of ``declared_outputs`` (sandbox/policy/declarations.py), as a reply."""
    try:
        return parse_declared_outputs(value)
    except DeclarationProblem as exc:
        raise _bad(exc.field, exc.problem) from None


def parse_turn_request(
    params: Mapping[str, Any], *, session_id: str | None = None, default_timeout_ms: int = 30_000
) -> TurnRequest:
    """Validate a ``turn.submit`` request (or a stored spec); raises `RequestError`.

    ``declared_outputs`` is required for both kinds (FR-RT-013). An instruction turn's executor
    writes nothing on this host, so for instruction turns it must be the empty list.
    """
    sid = session_id if session_id is not None else params.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise _bad("session_id", "is required (open a session first: `hunter session open`)")
    kind_value = params.get("kind")
    try:
        kind = TurnKind(str(kind_value))
    except ValueError:
        raise _bad("kind", f"must be 'instruction' or 'process', got {kind_value!r}") from None
    if "declared_outputs" not in params:
        raise _bad(
            "declared_outputs",
            "is required (list the files the turn writes; [] when it writes nothing)",
        )
    declared = _declared_outputs(params["declared_outputs"])
    inputs_value = params.get("declared_inputs", [])
    if not isinstance(inputs_value, list) or not all(isinstance(x, str) for x in inputs_value):
        raise _bad("declared_inputs", "must be a list of paths")
    phase_value = params.get("phase")
    phase: AgentPhase | None = None
    if phase_value is not None:
        try:
            phase = AgentPhase(phase_value)
        except ValueError:
            raise _bad(
                "phase", f"must be RED, GREEN, VERIFY or REFACTOR, got {phase_value!r}"
            ) from None
    key = _opt_str(params, "idempotency_key")
    if key is not None and not 1 <= len(key) <= 200:
        raise _bad("idempotency_key", "must be 1..200 characters")
    timeout_ms = _timeout(params, default_timeout_ms)
    traceparent = _opt_str(params, "traceparent")
    if traceparent is not None and parse_traceparent(traceparent) is None:
        raise _bad("traceparent", "must be a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>")
    if kind is TurnKind.INSTRUCTION:
        if declared:
            raise _bad(
                "declared_outputs",
                "must be [] for an instruction turn: executors write nothing on this host",
            )
        command_value = params.get("command_type")
        try:
            command = ExecutorCommandType(command_value)
        except ValueError:
            names = ", ".join(c.value for c in ExecutorCommandType)
            raise _bad("command_type", f"must be one of {names}, got {command_value!r}") from None
        parameters = params.get("parameters")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, Mapping):
            raise _bad("parameters", "must be an object of string/int/bool values")
        spec = InstructionSpec(
            command_type=command,
            timeout_ms=timeout_ms,
            target_url=_opt_str(params, "target_url", default="") or "",
            target_selector=_opt_str(params, "target_selector", default="") or "",
            parameters=dict(parameters),
        )
        # Validate with the Phase-20 rules now so a bad instruction is refused at intake.
        try:
            build_executor_instruction(
                instruction_id="INS-0-1",
                execution_id="EXE-0",
                command_type=spec.command_type,
                target_url=spec.target_url,
                target_selector=spec.target_selector,
                timestamp=iso_now(),
                timeout_ms=spec.timeout_ms,
                parameters=dict(spec.parameters),
            )
        except InstructionError as exc:
            raise RequestError(
                "invalid_instruction",
                f"{exc.field}: {exc.reason}",
                field=exc.field,
                reason_code=exc.reason_code,
            ) from None
        return TurnRequest(
            session_id=sid,
            kind=kind,
            declared_outputs=declared,
            declared_inputs=tuple(inputs_value),
            phase=phase,
            idempotency_key=key,
            instruction=spec,
            traceparent=traceparent,
        )
    argv = params.get("argv")
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) for a in argv)
        or not argv[0]
    ):
        raise _bad("argv", "must be a non-empty list of strings (the command and its arguments)")
    return TurnRequest(
        session_id=sid,
        kind=kind,
        declared_outputs=declared,
        declared_inputs=tuple(inputs_value),
        phase=phase,
        idempotency_key=key,
        process=ProcessSpec(argv=tuple(argv), timeout_ms=timeout_ms),
        traceparent=traceparent,
    )


def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
