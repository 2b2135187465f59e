"""Phase-21 closed enums: fault types, sandbox decisions, retry policies (seeds 000/002).

Values are the member names as strings (not ``auto()`` integers as in seed 002) so they can be
written to ledgers and sent over the wire unchanged. The enums are closed: the engine denies any
value that is not a member.
"""

from __future__ import annotations

from enum import Enum, unique


@unique
class ExecutionFaultType(Enum):
    """Execution fault types. CLOSED."""

    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    PARTIAL = "PARTIAL"
    INVALID_RESPONSE = "INVALID_RESPONSE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    SECURITY_VIOLATION = "SECURITY_VIOLATION"


@unique
class SandboxDecision(Enum):
    """Sandbox decisions. CLOSED."""

    TERMINATE = "TERMINATE"
    RETRY = "RETRY"
    ESCALATE = "ESCALATE"


@unique
class RetryPolicy(Enum):
    """Retry policies. CLOSED.

    ``RETRY_ONCE`` is part of the closed vocabulary but the seed-000 table never yields it; it is
    kept for an operator resolving an escalation ("retry once more"), see docs/policy.md.
    """

    NO_RETRY = "NO_RETRY"
    RETRY_ONCE = "RETRY_ONCE"
    RETRY_LIMITED = "RETRY_LIMITED"
    HUMAN_DECISION = "HUMAN_DECISION"
