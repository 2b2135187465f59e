"""Exceptions of the pure policy core (no I/O; the sandbox edge has its own ``errors.py``).

Each exception says when it is raised and carries structured fields that logs and ledgers record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.policy import reason_codes

if TYPE_CHECKING:
    from sandbox.policy.attempts import AgentPhase


class InstructionError(ValueError):
    """Raised by ``build_executor_instruction`` when the request data breaks a Phase-20 rule.

    ``field`` names the offending input field and ``reason`` says what is wrong with it;
    ``reason_code`` is always ``INSTRUCTION_REJECTED``.
    """

    def __init__(self, *, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        self.reason_code = reason_codes.INSTRUCTION_REJECTED
        super().__init__(f"{field}: {reason}")


class SandboxRetryExhaustedError(Exception):
    """Raised by ``SandboxRetryProtocol.execute_with_retry`` when every attempt failed.

    Raised for a persistent failure that used the whole attempt budget in GREEN/VERIFY (the
    entropy detector has then been notified) and for a transient fault (CRASH/TIMEOUT) that hit
    the budget (the entropy detector is not notified: the failure was not the agent's).
    ``exit_code`` is the last attempt's exit code, ``attempt_count`` the attempts made,
    ``phase`` the agent phase and ``tool_call_id`` the tool call's id; ``reason_code`` is the
    final decision's reason code.
    """

    def __init__(
        self,
        exit_code: int | None,
        attempt_count: int,
        phase: AgentPhase | None,
        tool_call_id: str,
        *,
        reason_code: str = reason_codes.RETRY_BUDGET_EXHAUSTED,
    ) -> None:
        self.exit_code = exit_code
        self.attempt_count = attempt_count
        self.phase = phase
        self.tool_call_id = tool_call_id
        self.reason_code = reason_code
        phase_name = phase.value if phase is not None else "none"
        super().__init__(
            f"tool call {tool_call_id!r} failed {attempt_count} attempt(s) in phase {phase_name} "
            f"(last exit code {exit_code}, {reason_code})"
        )
