# The `sandbox` package: the pure policy core and, beside it, the subprocess sandbox.
#
# Layering: `sandbox` may import `ledger`, never `supervisor`. This __init__ re-exports only the
# PURE policy core (Phase-21 decisions, Phase-20 executor safety, the seed-003 retry protocol and
# the attempt mapping of DESIGN.md), which imports no I/O module (os, subprocess, socket, io,
# pathlib, threading, browsers, ...; tests/policy/test_purity.py enforces it). The sandbox edge
# modules that do I/O (packages, capabilities, runtime, errors, cli) are imported explicitly by
# their users, so `import sandbox` stays I/O-free.
"""HUMANOID HUNTER sandbox: pure policy core (re-exported here) and the sandbox edge."""

from sandbox import reason_codes as reason_codes
from sandbox.attempt_policy import RETRYABLE_PHASES as RETRYABLE_PHASES
from sandbox.attempt_policy import AgentPhase as AgentPhase
from sandbox.attempt_policy import AttemptDecision as AttemptDecision
from sandbox.attempt_policy import AttemptOutcome as AttemptOutcome
from sandbox.attempt_policy import OutcomeKind as OutcomeKind
from sandbox.attempt_policy import RetryOptions as RetryOptions
from sandbox.attempt_policy import Verdict as Verdict
from sandbox.attempt_policy import decide_attempt as decide_attempt
from sandbox.attempt_policy import outcome_from_response as outcome_from_response
from sandbox.error_classifier import EXIT_COMPILATION_ERROR as EXIT_COMPILATION_ERROR
from sandbox.error_classifier import (
    EXIT_DOCKER_DAEMON_UNAVAILABLE as EXIT_DOCKER_DAEMON_UNAVAILABLE,
)
from sandbox.error_classifier import EXIT_NETWORK_TIMEOUT as EXIT_NETWORK_TIMEOUT
from sandbox.error_classifier import ErrorClass as ErrorClass
from sandbox.error_classifier import ErrorClassifier as ErrorClassifier
from sandbox.executor_safety import build_executor_instruction as build_executor_instruction
from sandbox.executor_safety import enforce_executor_safety as enforce_executor_safety
from sandbox.executor_safety import instruction_from_wire as instruction_from_wire
from sandbox.executor_safety import instruction_to_wire as instruction_to_wire
from sandbox.executor_safety import response_to_wire as response_to_wire
from sandbox.executor_safety import validate_executor_response as validate_executor_response
from sandbox.executor_types import ExecutionSafetyResult as ExecutionSafetyResult
from sandbox.executor_types import ExecutorCommandType as ExecutorCommandType
from sandbox.executor_types import ExecutorInstructionEnvelope as ExecutorInstructionEnvelope
from sandbox.executor_types import ExecutorResponseEnvelope as ExecutorResponseEnvelope
from sandbox.executor_types import ExecutorResponseType as ExecutorResponseType
from sandbox.executor_types import ExecutorStatus as ExecutorStatus
from sandbox.policy_errors import InstructionError as InstructionError
from sandbox.policy_errors import SandboxRetryExhaustedError as SandboxRetryExhaustedError
from sandbox.retry_protocol import CountingEntropyDetector as CountingEntropyDetector
from sandbox.retry_protocol import EntropyDetector as EntropyDetector
from sandbox.retry_protocol import EntropyStatistics as EntropyStatistics
from sandbox.retry_protocol import RetryRun as RetryRun
from sandbox.retry_protocol import SandboxExecutor as SandboxExecutor
from sandbox.retry_protocol import SandboxRetryProtocol as SandboxRetryProtocol
from sandbox.retry_protocol import ToolCall as ToolCall
from sandbox.retry_protocol import ToolResult as ToolResult
from sandbox.sandbox_context import FaultReport as FaultReport
from sandbox.sandbox_context import SandboxContext as SandboxContext
from sandbox.sandbox_context import SandboxDecisionResult as SandboxDecisionResult
from sandbox.sandbox_engine import classify_fault as classify_fault
from sandbox.sandbox_engine import decide_sandbox_outcome as decide_sandbox_outcome
from sandbox.sandbox_engine import enforce_retry_limit as enforce_retry_limit
from sandbox.sandbox_engine import is_retry_allowed as is_retry_allowed
from sandbox.sandbox_types import ExecutionFaultType as ExecutionFaultType
from sandbox.sandbox_types import RetryPolicy as RetryPolicy
from sandbox.sandbox_types import SandboxDecision as SandboxDecision

__all__ = [
    "EXIT_COMPILATION_ERROR",
    "EXIT_DOCKER_DAEMON_UNAVAILABLE",
    "EXIT_NETWORK_TIMEOUT",
    "RETRYABLE_PHASES",
    "AgentPhase",
    "AttemptDecision",
    "AttemptOutcome",
    "CountingEntropyDetector",
    "EntropyDetector",
    "EntropyStatistics",
    "ErrorClass",
    "ErrorClassifier",
    "ExecutionFaultType",
    "ExecutionSafetyResult",
    "ExecutorCommandType",
    "ExecutorInstructionEnvelope",
    "ExecutorResponseEnvelope",
    "ExecutorResponseType",
    "ExecutorStatus",
    "FaultReport",
    "InstructionError",
    "OutcomeKind",
    "RetryOptions",
    "RetryPolicy",
    "RetryRun",
    "SandboxContext",
    "SandboxDecision",
    "SandboxDecisionResult",
    "SandboxExecutor",
    "SandboxRetryExhaustedError",
    "SandboxRetryProtocol",
    "ToolCall",
    "ToolResult",
    "Verdict",
    "build_executor_instruction",
    "classify_fault",
    "decide_attempt",
    "decide_sandbox_outcome",
    "enforce_executor_safety",
    "enforce_retry_limit",
    "instruction_from_wire",
    "instruction_to_wire",
    "is_retry_allowed",
    "outcome_from_response",
    "reason_codes",
    "response_to_wire",
    "validate_executor_response",
]
