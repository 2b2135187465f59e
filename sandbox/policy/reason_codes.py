"""Stable reason codes of the pure policy core.

Every decision the core makes (Phase-21 fault decisions, Phase-20 response checks, the attempt
mapping of docs/policy.md) carries one of these UPPER_SNAKE strings. They are written to ledgers and
logs and matched by tests and operators, so a code never changes meaning once released; new
situations get new codes. ``docs/policy.md`` says when each one is produced.
"""

from __future__ import annotations

from typing import Final

# --- Phase-21 decision table (seed 000 section 6) -------------------------------------------
RETRY_AFTER_CRASH: Final = "RETRY_AFTER_CRASH"  # CRASH with attempt < max_retries: RETRY
RETRY_AFTER_TIMEOUT: Final = "RETRY_AFTER_TIMEOUT"  # TIMEOUT with attempt < max_retries: RETRY
CRASH_RETRY_LIMIT_REACHED: Final = "CRASH_RETRY_LIMIT_REACHED"  # CRASH at attempt == max: TERMINATE
TIMEOUT_RETRY_LIMIT_REACHED: Final = "TIMEOUT_RETRY_LIMIT_REACHED"  # TIMEOUT at attempt == max
PARTIAL_NOT_RETRYABLE: Final = "PARTIAL_NOT_RETRYABLE"  # PARTIAL output: TERMINATE, never retried
INVALID_RESPONSE_NOT_RETRYABLE: Final = "INVALID_RESPONSE_NOT_RETRYABLE"  # malformed: TERMINATE
RESOURCE_EXHAUSTED_ESCALATE: Final = "RESOURCE_EXHAUSTED_ESCALATE"  # out of resources: ESCALATE
SECURITY_VIOLATION_TERMINATE: Final = "SECURITY_VIOLATION_TERMINATE"  # breach: immediate TERMINATE

# --- Phase-21 deny-by-default (malformed or unknown input, always TERMINATE) -----------------
DENY_FAULT_MALFORMED: Final = "DENY_FAULT_MALFORMED"  # fault not a FaultReport or a field mistyped
DENY_FAULT_TYPE_UNKNOWN: Final = "DENY_FAULT_TYPE_UNKNOWN"  # fault_type not an ExecutionFaultType
DENY_CONTEXT_MALFORMED: Final = "DENY_CONTEXT_MALFORMED"  # context is not a SandboxContext
DENY_EXECUTION_ID_INVALID: Final = "DENY_EXECUTION_ID_INVALID"  # context execution_id empty/not str
DENY_INSTRUCTION_ID_INVALID: Final = "DENY_INSTRUCTION_ID_INVALID"  # instruction_id empty/not str
DENY_ATTEMPT_NUMBER_INVALID: Final = "DENY_ATTEMPT_NUMBER_INVALID"  # attempt not an int >= 1
DENY_MAX_RETRIES_INVALID: Final = "DENY_MAX_RETRIES_INVALID"  # max_retries not an int >= 1
DENY_TIMEOUT_INVALID: Final = "DENY_TIMEOUT_INVALID"  # timeout_ms not an int > 0
DENY_TIMESTAMP_INVALID: Final = "DENY_TIMESTAMP_INVALID"  # timestamp is not a str
DENY_EXECUTION_ID_MISMATCH: Final = "DENY_EXECUTION_ID_MISMATCH"  # fault belongs to another run
DENY_ATTEMPT_NUMBER_MISMATCH: Final = "DENY_ATTEMPT_NUMBER_MISMATCH"  # fault names another attempt
DENY_ATTEMPT_LIMIT_EXCEEDED: Final = "DENY_ATTEMPT_LIMIT_EXCEEDED"  # attempt > max_retries

# --- Attempt mapping (docs/policy.md "How the seeds combine", attempts.py) ---------------------
ATTEMPT_SUCCEEDED: Final = "ATTEMPT_SUCCEEDED"  # exit 0 / accepted SUCCESS response: SUCCEED
PERSISTENT_FAILURE_RETRY: Final = "PERSISTENT_FAILURE_RETRY"  # failure in GREEN/VERIFY, budget left
RETRY_BUDGET_EXHAUSTED: Final = "RETRY_BUDGET_EXHAUSTED"  # failure on the last attempt: EXHAUSTED
FAILURE_NOT_RETRIED: Final = "FAILURE_NOT_RETRIED"  # failure, no phase: not retried
PHASE_NOT_RETRYABLE: Final = "PHASE_NOT_RETRYABLE"  # retryable outcome in RED/REFACTOR: TERMINATE
EXECUTOR_REFUSED: Final = "EXECUTOR_REFUSED"  # executor answered REFUSED: TERMINATE, no retry
DENY_OUTCOME_MALFORMED: Final = "DENY_OUTCOME_MALFORMED"  # bad/inconsistent outcome
DENY_PHASE_UNKNOWN: Final = "DENY_PHASE_UNKNOWN"  # phase neither None nor an AgentPhase
DENY_OPTIONS_INVALID: Final = "DENY_OPTIONS_INVALID"  # options is not a RetryOptions
NO_CAPABLE_EXECUTOR: Final = "NO_CAPABLE_EXECUTOR"  # no connected executor serves it: TERMINATE
CIRCUIT_OPEN: Final = "CIRCUIT_OPEN"  # the command type's circuit breaker is open: TERMINATE
DAEMON_RETRY_BUDGET_EXHAUSTED: Final = "DAEMON_RETRY_BUDGET_EXHAUSTED"  # budget: not retried

# --- Phase-20 executor responses (seed 001 section 6, executor_safety.py) --------------------
RESPONSE_ACCEPTED: Final = "RESPONSE_ACCEPTED"  # passed every rule: allowed
RESPONSE_ACCEPTED_PARTIAL: Final = "RESPONSE_ACCEPTED_PARTIAL"  # passed, but partial=true (PARTIAL)
INSTRUCTION_INVALID: Final = "INSTRUCTION_INVALID"  # caller passed no ExecutorInstructionEnvelope
RESPONSE_MALFORMED: Final = "RESPONSE_MALFORMED"  # not a JSON object, or a non-str key
RESPONSE_TOO_LARGE: Final = "RESPONSE_TOO_LARGE"  # nesting, size or string bounds exceeded
RESPONSE_CLAIMS_AUTHORITY: Final = "RESPONSE_CLAIMS_AUTHORITY"  # tries to set decision/policy/...
RESPONSE_UNKNOWN_FIELD: Final = "RESPONSE_UNKNOWN_FIELD"  # top-level field outside the allow-list
RESPONSE_FIELD_TYPE_INVALID: Final = "RESPONSE_FIELD_TYPE_INVALID"  # a known field has a wrong type
RESPONSE_MISSING_INSTRUCTION_ID: Final = "RESPONSE_MISSING_INSTRUCTION_ID"  # absent, null or ""
RESPONSE_INSTRUCTION_ID_MISMATCH: Final = "RESPONSE_INSTRUCTION_ID_MISMATCH"  # answers another one
RESPONSE_TYPE_UNKNOWN: Final = "RESPONSE_TYPE_UNKNOWN"  # response_type absent or not a member name
RESPONSE_EVIDENCE_HASH_INVALID: Final = "RESPONSE_EVIDENCE_HASH_INVALID"  # not 64 lowercase hex
SUCCESS_WITHOUT_EVIDENCE: Final = "SUCCESS_WITHOUT_EVIDENCE"  # SUCCESS with no evidence_hash

# --- Phase-20 instruction building ----------------------------------------------------------
INSTRUCTION_REJECTED: Final = "INSTRUCTION_REJECTED"  # build_executor_instruction refused input

#: Every reason code above, for tests and documentation checks.
ALL_REASON_CODES: Final[frozenset[str]] = frozenset(
    value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and name == value
)
