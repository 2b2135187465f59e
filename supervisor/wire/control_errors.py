"""The errors of decoding a control request: `RequestDecodeError` (the answer's ``error``, with
its stable code, the field at fault and what to do), `FieldProblem` (raised by a params
struct's own check, kept by msgspec as the cause), and `HINTS`, what to do per field. Apart from
the requests so that the params' checks and the decoder share them without importing each
other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import RequestError
from supervisor.wire.control_fields import MAX_WAIT_S, RequestId

__all__ = ["HINTS", "FieldProblem", "RequestDecodeError"]


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


class FieldProblem(ValueError):
    """Raised inside ``__post_init__``: msgspec keeps it as the ValidationError's cause."""

    def __init__(self, code: str, field_name: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.code = code
        self.field = field_name
        self.message = message
        self.details = details


_STATES: Final = ", ".join(s.value for s in TurnState)
#: What to do, per field: appended to the message of a field that failed.
HINTS: Final[Mapping[str, str]] = {
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
    "wait_s": f"a number of seconds, 0..{MAX_WAIT_S:g}",
    "answer": "'full' (the whole turn, the default) or 'compact' (its outcome only)",
    "timeout_s": f"a number of seconds, 0..{MAX_WAIT_S:g}",
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
