"""Turns submitted in tests as the daemon takes them: a ``turn.submit``'s params through the
control wire's decoder (`supervisor.wire.control.convert_request`, the checks of a real frame)
and then `supervisor.turns.requests.turn_request` (the rules no type can say)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.turns.requests import TurnRequest, turn_request
from supervisor.wire.control import TurnSubmit, convert_request
from supervisor.wire.turn_spec import InstructionSpec, ProcessSpec


def submitted(params: Mapping[str, object], *, default_timeout_ms: int = 30_000) -> TurnRequest:
    """The checked turn of *params* (raises `RequestError`, as the control API answers)."""
    request = convert_request({"id": 1, "op": "turn.submit", "params": dict(params)})
    assert isinstance(request, TurnSubmit)
    return turn_request(request.params, default_timeout_ms=default_timeout_ms)


#: A checked instruction turn's spec (READ, 1 s), for records built by hand.
READ_SPEC: Final = InstructionSpec(timeout_ms=1_000, command_type=ExecutorCommandType.READ)
#: A checked process turn's spec (``true``), for records built by hand.
TRUE_SPEC: Final = ProcessSpec(timeout_ms=1_000, argv=("true",))
