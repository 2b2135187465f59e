# The `sandbox` package: the pure policy core and, beside it, the subprocess sandbox.
#
# Layering: `sandbox` may import `ledger`, never `supervisor`. This __init__ re-exports only the
# PURE policy core (Phase-21 decisions, Phase-20 executor safety, the seed-003 retry protocol and
# the attempt mapping of docs/policy.md), which imports no I/O module (os, subprocess, socket, io,
# pathlib, threading, browsers, ...; tests/sandbox/policy/test_purity.py enforces it). The
# sandbox edge modules that do I/O (packages, capabilities, runtime, errors, cli) are imported
# explicitly by their users, so `import sandbox` stays I/O-free.
"""HUMANOID HUNTER sandbox: pure policy core (re-exported here) and the sandbox edge."""

from sandbox.policy import reason_codes as reason_codes
from sandbox.policy.attempts import RETRYABLE_PHASES as RETRYABLE_PHASES
from sandbox.policy.attempts import AgentPhase as AgentPhase
from sandbox.policy.attempts import AttemptDecision as AttemptDecision
from sandbox.policy.attempts import AttemptOutcome as AttemptOutcome
from sandbox.policy.attempts import OutcomeKind as OutcomeKind
from sandbox.policy.attempts import RetryOptions as RetryOptions
from sandbox.policy.attempts import Verdict as Verdict
from sandbox.policy.attempts import decide_attempt as decide_attempt
from sandbox.policy.attempts import outcome_from_response as outcome_from_response
from sandbox.policy.classifier import EXIT_COMPILATION_ERROR as EXIT_COMPILATION_ERROR
from sandbox.policy.classifier import (
    EXIT_DOCKER_DAEMON_UNAVAILABLE as EXIT_DOCKER_DAEMON_UNAVAILABLE,
)
from sandbox.policy.classifier import EXIT_NETWORK_TIMEOUT as EXIT_NETWORK_TIMEOUT
from sandbox.policy.classifier import ErrorClass as ErrorClass
from sandbox.policy.classifier import ErrorClassifier as ErrorClassifier
from sandbox.policy.context import FaultReport as FaultReport
from sandbox.policy.context import SandboxContext as SandboxContext
from sandbox.policy.context import SandboxDecisionResult as SandboxDecisionResult
from sandbox.policy.engine import classify_fault as classify_fault
from sandbox.policy.engine import decide_sandbox_outcome as decide_sandbox_outcome
from sandbox.policy.engine import enforce_retry_limit as enforce_retry_limit
from sandbox.policy.engine import is_retry_allowed as is_retry_allowed
from sandbox.policy.envelopes import ExecutionSafetyResult as ExecutionSafetyResult
from sandbox.policy.envelopes import ExecutorCommandType as ExecutorCommandType
from sandbox.policy.envelopes import ExecutorInstructionEnvelope as ExecutorInstructionEnvelope
from sandbox.policy.envelopes import ExecutorResponseEnvelope as ExecutorResponseEnvelope
from sandbox.policy.envelopes import ExecutorResponseType as ExecutorResponseType
from sandbox.policy.envelopes import ExecutorStatus as ExecutorStatus
from sandbox.policy.errors import InstructionError as InstructionError
from sandbox.policy.errors import SandboxRetryExhaustedError as SandboxRetryExhaustedError
from sandbox.policy.faults import ExecutionFaultType as ExecutionFaultType
from sandbox.policy.faults import RetryPolicy as RetryPolicy
from sandbox.policy.faults import SandboxDecision as SandboxDecision
from sandbox.policy.retry_protocol import CountingEntropyDetector as CountingEntropyDetector
from sandbox.policy.retry_protocol import EntropyDetector as EntropyDetector
from sandbox.policy.retry_protocol import EntropyStatistics as EntropyStatistics
from sandbox.policy.retry_protocol import RetryRun as RetryRun
from sandbox.policy.retry_protocol import SandboxExecutor as SandboxExecutor
from sandbox.policy.retry_protocol import SandboxRetryProtocol as SandboxRetryProtocol
from sandbox.policy.retry_protocol import ToolCall as ToolCall
from sandbox.policy.retry_protocol import ToolResult as ToolResult
from sandbox.policy.safety import build_executor_instruction as build_executor_instruction
from sandbox.policy.safety import enforce_executor_safety as enforce_executor_safety
from sandbox.policy.safety import instruction_from_wire as instruction_from_wire
from sandbox.policy.safety import instruction_to_wire as instruction_to_wire
from sandbox.policy.safety import response_to_wire as response_to_wire
from sandbox.policy.safety import validate_executor_response as validate_executor_response

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
