"""A turn's spec: the one typed form of a submitted turn, from intake to the store and back.

`TurnSpec` is a tagged union (``kind`` is the tag) of `InstructionSpec` and `ProcessSpec`. The
control API builds it once from ``turn.submit``'s decoded params (`supervisor.turns.requests`,
which also applies the declaration and Phase-20 rules once); the store keeps it encoded with
`encode_spec` and every engine reads it back with `decode_spec` as the same type, so a turn
taken back after a restart (or by another daemon of a fleet) runs from the very value that was
accepted. There is no mapping in between and no second parser.

The encoded form is the JSON object the store has always held (``kind``, ``declared_outputs``
as ``{path, role}`` objects, ``declared_inputs``, ``phase``, ``timeout_ms``, ``traceparent`` and
the kind's own fields), so rows written by earlier releases decode unchanged.
"""

from __future__ import annotations

from typing import Final

import msgspec

from sandbox.policy.attempts import AgentPhase
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnKind

__all__ = [
    "InstructionSpec",
    "ProcessSpec",
    "TurnSpec",
    "decode_spec",
    "encode_spec",
    "spec_to_dict",
]


class _Spec(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What every kind of turn carries."""

    timeout_ms: int
    #: the files the turn promises to write (always () for an instruction turn)
    declared_outputs: tuple[DeclaredOutput, ...] = ()
    declared_inputs: tuple[str, ...] = ()
    phase: AgentPhase | None = None
    #: the client's W3C trace context (`supervisor.traces`), kept with the turn
    traceparent: str | None = None


class InstructionSpec(_Spec, frozen=True, kw_only=True, tag="instruction"):
    """A turn whose attempts are instruction envelopes sent to an external executor."""

    command_type: ExecutorCommandType
    target_url: str = ""
    target_selector: str = ""
    parameters: dict[str, str | int | bool] = {}

    @property
    def kind(self) -> TurnKind:
        return TurnKind.INSTRUCTION


class ProcessSpec(_Spec, frozen=True, kw_only=True, tag="process"):
    """A turn whose attempts are a confined subprocess run by the daemon."""

    argv: tuple[str, ...]

    @property
    def kind(self) -> TurnKind:
        return TurnKind.PROCESS


TurnSpec = InstructionSpec | ProcessSpec

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final[msgspec.json.Decoder[TurnSpec]] = msgspec.json.Decoder(TurnSpec)


def encode_spec(spec: TurnSpec) -> bytes:
    """The spec as the store keeps it (JSON)."""
    return _ENCODER.encode(spec)


def decode_spec(blob: bytes | bytearray | memoryview | str) -> TurnSpec:
    """A stored spec, back as the type it was accepted as. A row that does not decode is a
    damaged store: `msgspec.ValidationError` / `DecodeError` name the field."""
    return _DECODER.decode(blob)


def spec_to_dict(spec: TurnSpec) -> dict[str, object]:
    """The spec as JSON-ready data (a turn's ``spec`` in control answers and the ledgers)."""
    out = msgspec.json.decode(_ENCODER.encode(spec))  # lists, not tuples, as a client sees it
    assert isinstance(out, dict)
    return out
