"""A turn's spec: the one typed form of a submitted turn, from intake to the store and back.

`TurnSpec` is a tagged union (``kind`` is the tag) of `InstructionSpec` and `ProcessSpec`. The
control API builds it once from ``turn.submit``'s decoded params (`supervisor.turns.requests`,
which also applies the declaration and Phase-20 rules once); the store keeps it encoded with
`encode_spec` and every engine reads it back with `decode_spec` as the same type, so a turn
taken back after a restart (or by another daemon of a fleet) runs from the very value that was
accepted. There is no mapping in between and no second parser.

The encoded form is the JSON object the store has always held (``kind``, ``declared_outputs``
as ``{path, role}`` objects, ``declared_inputs``, ``phase``, ``timeout_ms``, ``traceparent`` and
the kind's own fields), so rows written by earlier releases decode unchanged. ``requested_by``
(who asked, through a front end such as `hunter mcp`) is left out of the encoding when unset, so a
turn submitted without it is encoded, hashed and answered exactly as before.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import UNSET, Meta, UnsetType

from sandbox.policy.attempts import AgentPhase
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnKind

__all__ = [
    "InstructionSpec",
    "ProcessSpec",
    "RequestedBy",
    "TurnSpec",
    "decode_spec",
    "encode_spec",
    "requested_by_text",
    "spec_to_dict",
]


_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_Version = Annotated[str, Meta(max_length=128)]
_Uint32 = Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)]


class RequestedBy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who asked for a turn through a front end of the daemon: ``via`` names the front end
    (``mcp``: `hunter mcp`), ``client_name`` and ``client_version`` the program that called it
    (an MCP client, as its initialize handshake named itself), and ``server_*``, ``uid`` and
    ``pid`` the front end's own instance. Kept with the turn's spec, shown by ``turn.get`` and
    written into the turn's evidence ledger entry. What the front end says: the daemon does not
    prove it (the control socket's peer is that front end)."""

    via: Annotated[str, Meta(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_-]*$")]
    client_name: _Name
    client_version: _Version | None = None
    server_name: _Name
    server_version: _Version
    uid: _Uint32
    pid: _Uint32


class _Spec(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What every kind of turn carries."""

    timeout_ms: int
    #: the files the turn promises to write (always () for an instruction turn)
    declared_outputs: tuple[DeclaredOutput, ...] = ()
    declared_inputs: tuple[str, ...] = ()
    phase: AgentPhase | None = None
    #: the client's W3C trace context (`supervisor.traces`), kept with the turn
    traceparent: str | None = None
    #: who asked, through a front end (`RequestedBy`); left out of the encoding when unset
    requested_by: RequestedBy | UnsetType = UNSET


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


def requested_by_text(value: object) -> str | None:
    """A spec's ``requested_by`` (as JSON data) in one line for people (`hunter turn show`, the
    console's turn page); None when the turn has none."""
    if not isinstance(value, dict):
        return None
    client = " ".join(str(value[k]) for k in ("client_name", "client_version") if value.get(k))
    server = " ".join(str(value[k]) for k in ("server_name", "server_version") if value.get(k))
    return (
        f"{client or 'an unnamed client'} via {value.get('via')}"
        f" ({server}, uid {value.get('uid')}, pid {value.get('pid')})"
    )
