"""The constrained field types of the control API's requests (`supervisor.wire.control`):
ids, paths, seconds, times, texts, tenants, a decision's reason and operator, and the bounds
they share. Apart so that the params, the requests and the errors name one definition each."""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias

from msgspec import Meta

__all__ = [
    "EVIDENCE_CHUNK_MAX",
    "MAX_TURN_ID",
    "MAX_WAIT_S",
    "Id",
    "Micros",
    "Operator",
    "Path",
    "Priority",
    "Reason",
    "RequestId",
    "Seconds",
    "Tenant",
    "Text",
    "TurnAnswer",
    "WaitAnswer",
]

#: Turn ids are SQLite integer keys: positive and below 2**63.
MAX_TURN_ID: Final = 2**63 - 1
#: ``turn.evidence`` answers at most this many bytes at a time (base64: a third more), well
#: inside the default frame limit of 1 MiB
EVIDENCE_CHUNK_MAX: Final = 512 * 1024
#: Longest wait a client may ask for (one year, in seconds).
MAX_WAIT_S: Final = 365 * 86_400.0

#: A request's id: the answer echoes it, so an integer id is a 64-bit one, which the JSON
#: encoder can write; a larger one is a bad ``id``, never an answer that cannot be sent.
RequestId: TypeAlias = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | str | None
Id = Annotated[str, Meta(min_length=1, max_length=256)]
Path = Annotated[str, Meta(min_length=1, max_length=4096)]
Seconds = Annotated[float, Meta(ge=0, le=MAX_WAIT_S)]
#: A time: microseconds since the Unix epoch.
Micros = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Text = Annotated[str, Meta(max_length=65_536)]
#: A tenant label: letters, digits and ``. _ : @ -``, starting with a letter or digit.
Tenant = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
]
#: Why a person decided (``escalations.resolve``, ``turn.cancel``, ``drain``): recorded with the
#: decision (`supervisor.turns.decisions`); not blank.
Reason = Annotated[str, Meta(min_length=1, max_length=2000)]
#: Who decided, as the client names them (default: the user name of the caller's uid).
Operator = Annotated[str, Meta(min_length=1, max_length=256)]
#: A session's weight among tenants (`supervisor.turns.fairness.MAX_PRIORITY` is the bound).
Priority = Annotated[int, Meta(ge=1, le=10)]
#: How much of the turn an answer carries: the whole turn object, or only its outcome
#: (``supervisor.control.answers.compact_turn``: ids, state, verdict, reason code, attempt,
#: evidence hash).
TurnAnswer: TypeAlias = Literal["full", "compact"]
#: What `turn.wait` answers: a `TurnAnswer`, or ``"record"``: the whole turn and its ledger
#: entries, as ``turn.get`` answers (one round trip where a wait and a get took two).
WaitAnswer: TypeAlias = Literal["full", "compact", "record"]
