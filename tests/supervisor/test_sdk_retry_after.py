"""The Python SDK's ``retry_after_ms`` on FAILURE and ERROR results."""

from __future__ import annotations

import pytest

from sandbox.policy.safety import build_executor_instruction, validate_executor_response
from supervisor.sdk import Result
from supervisor.wire.executor import MAX_RETRY_AFTER_MS

INSTRUCTION = build_executor_instruction(
    instruction_id="INS-1-1",
    execution_id="EXE-1",
    command_type="READ",
    target_selector="h1",
    timestamp="2026-01-01T00:00:00Z",
    timeout_ms=1000,
)


@pytest.mark.parametrize("value", [-1, MAX_RETRY_AFTER_MS + 1])
def test_the_sdk_refuses_a_bad_retry_after(value: int) -> None:
    """An SDK executor cannot send a value the daemon would deny."""
    with pytest.raises(ValueError, match=r"^retry_after_ms must be an int in 0\.\.3600000"):
        Result.error("busy", retry_after_ms=value)


def test_the_sdk_sends_retry_after_on_the_wire() -> None:
    """`Result.failure(..., retry_after_ms=...)` puts the field in the response object."""
    wire = Result.failure("busy", retry_after_ms=250).to_wire("INS-1-1")
    assert wire["retry_after_ms"] == 250
    assert "retry_after_ms" not in Result.failure("busy").to_wire("INS-1-1")
    assert validate_executor_response(INSTRUCTION, wire).is_safe
