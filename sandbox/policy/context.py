"""Phase-21 frozen records: the context of an attempt, a fault report and a decision.

``SandboxContext`` and ``FaultReport`` deliberately do not validate in ``__post_init__``: they
carry untrusted data to the engine, which must be able to receive malformed values and deny them
(TERMINATE with a reason code). Type hints are not trusted; the engine checks with isinstance.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision


@dataclass(frozen=True, slots=True)
class SandboxContext:
    """Where an attempt stands: attempts are numbered from 1, ``max_retries`` is the budget."""

    execution_id: str
    instruction_id: str
    attempt_number: int
    max_retries: int
    timeout_ms: int
    timestamp: str


@dataclass(frozen=True, slots=True)
class FaultReport:
    """A fault observed during one attempt of one execution."""

    fault_id: str
    execution_id: str
    fault_type: ExecutionFaultType
    fault_message: str
    occurred_at: str
    attempt_number: int


@dataclass(frozen=True, slots=True)
class SandboxDecisionResult:
    """The engine's answer: decision, the fault's retry policy and a stable reason code."""

    decision: SandboxDecision
    retry_policy: RetryPolicy
    reason_code: str
    reason_description: str
