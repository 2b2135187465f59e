"""Seed module name for the Phase-21 context, fault report and decision result.

Re-exports `sandbox.policy.context`, where the code lives."""

from sandbox.policy.context import FaultReport, SandboxContext, SandboxDecisionResult

__all__ = [
    "FaultReport",
    "SandboxContext",
    "SandboxDecisionResult",
]
