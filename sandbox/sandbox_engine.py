"""Seed module name for the Phase-21 decision engine.

Re-exports `sandbox.policy.engine`, where the code lives."""

from sandbox.policy.engine import (
    classify_fault,
    context_problem,
    decide_sandbox_outcome,
    enforce_retry_limit,
    is_retry_allowed,
    retry_limit_overrun,
)

__all__ = [
    "classify_fault",
    "context_problem",
    "decide_sandbox_outcome",
    "enforce_retry_limit",
    "is_retry_allowed",
    "retry_limit_overrun",
]
