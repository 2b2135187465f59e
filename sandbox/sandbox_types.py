"""Seed module name for the Phase-21 fault types, decisions and retry policies.

Re-exports `sandbox.policy.faults`, where the code lives."""

from sandbox.policy.faults import ExecutionFaultType, RetryPolicy, SandboxDecision

__all__ = [
    "ExecutionFaultType",
    "RetryPolicy",
    "SandboxDecision",
]
