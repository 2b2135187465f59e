"""Seed 003: the sandbox retry protocol for GREEN/VERIFY phases.

``SandboxRetryProtocol.execute_with_retry`` runs a tool call through an injected
``SandboxExecutor`` inside THE attempt loop (``sandbox.policy.attempt_loop.run_attempts``), which
asks ``decide_attempt`` (sandbox/policy/attempts.py, the one mapping, docs/policy.md) what to do
after every attempt; this module has neither retry rules nor a loop of its own. Backoff waits
go through the injected ``delay`` (required: the caller passes its event loop's sleep, such as
``anyio.sleep``; a zero backoff does not wait) so tests can record them. Every
attempt receives the same, deep-frozen ``ToolCall`` object (identical arguments); resetting the
sandbox or making the call idempotent between attempts is the executor's job.

Pure apart from awaiting the injected executor and delay: no I/O module is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempt_loop import AttemptReport, run_attempts
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    RetryOptions,
)
from sandbox.policy.classifier import (
    EXIT_COMPILATION_ERROR,
    EXIT_DOCKER_DAEMON_UNAVAILABLE,
    EXIT_NETWORK_TIMEOUT,
    ErrorClass,
    ErrorClassifier,
)
from sandbox.policy.envelopes import deep_freeze, deep_thaw
from sandbox.policy.errors import SandboxRetryExhaustedError

__all__ = [
    "EXIT_COMPILATION_ERROR",
    "EXIT_DOCKER_DAEMON_UNAVAILABLE",
    "EXIT_NETWORK_TIMEOUT",
    "AgentPhase",
    "CountingEntropyDetector",
    "EntropyDetector",
    "EntropyStatistics",
    "ErrorClass",
    "ErrorClassifier",
    "RetryOptions",
    "RetryRun",
    "SandboxExecutor",
    "SandboxRetryExhaustedError",
    "SandboxRetryProtocol",
    "ToolCall",
    "ToolResult",
    "call_fingerprint",
]

#: Reason codes after which ``execute_with_retry`` raises: the attempt budget was used up.
_BUDGET_CODES = frozenset(
    {rc.RETRY_BUDGET_EXHAUSTED, rc.CRASH_RETRY_LIMIT_REACHED, rc.TIMEOUT_RETRY_LIMIT_REACHED}
)


def _empty_arguments() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call: ``arguments`` are deep-frozen so every retry sees identical arguments."""

    id: str
    name: str
    arguments: Mapping[str, object] = field(default_factory=_empty_arguments)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", deep_freeze(self.arguments))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What an executor reports for one attempt.

    ``exit_code`` 0 is success. The flags say how a process ended when the exit code alone does
    not (``AttemptOutcome.from_exit_code`` gives them precedence over the code).
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    killed_by_signal: int | None = None
    resource_exhausted: bool = False
    security_violation: bool = False
    duration_ms: int = 0

    def outcome(self) -> AttemptOutcome:
        """This result as an attempt outcome (docs/policy.md, "How the seeds combine", item 3)."""
        return AttemptOutcome.from_exit_code(
            self.exit_code,
            killed_by_signal=self.killed_by_signal,
            timed_out=self.timed_out,
            resource_exhausted=self.resource_exhausted,
            security_violation=self.security_violation,
        )


@runtime_checkable
class SandboxExecutor(Protocol):
    """Runs one attempt of a tool call."""

    async def execute(self, tool_call: ToolCall) -> ToolResult:
        """Run ``tool_call`` once and report how it ended."""
        ...


@runtime_checkable
class EntropyDetector(Protocol):
    """Told about every persistent failure that used the whole attempt budget."""

    def record(self, tool_call: ToolCall, phase: AgentPhase) -> bool:
        """Record an exhaustion; return True when the detector's threshold has been crossed."""
        ...


def call_fingerprint(tool_call: ToolCall) -> str:
    """Name plus canonical (sorted-key JSON) arguments: equal calls share a fingerprint."""
    arguments = json.dumps(
        deep_thaw(tool_call.arguments), sort_keys=True, separators=(",", ":"), default=repr
    )
    return f"{tool_call.name}:{arguments}"


@dataclass(frozen=True, slots=True)
class EntropyStatistics:
    """Snapshot of a ``CountingEntropyDetector``."""

    threshold: int
    records: int
    fingerprints: int
    over_threshold: tuple[str, ...]


class CountingEntropyDetector:
    """Counts persistent exhaustions per call fingerprint; True once a count reaches threshold.

    ``record`` returns True on the exhaustion that reaches ``threshold`` and on every later one
    for the same fingerprint. Not thread-safe: use it from one event loop.
    """

    __slots__ = ("_counts", "_records", "threshold")

    def __init__(self, *, threshold: int = 3) -> None:
        if type(threshold) is not int or threshold < 1:
            msg = f"threshold must be an int >= 1, got {threshold!r}"
            raise ValueError(msg)
        self.threshold = threshold
        self._counts: dict[str, int] = {}
        self._records = 0

    def record(self, tool_call: ToolCall, phase: AgentPhase) -> bool:
        """Count one exhaustion of ``tool_call`` (``phase`` is not part of the fingerprint)."""
        del phase
        key = call_fingerprint(tool_call)
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        self._records += 1
        return count >= self.threshold

    def count(self, tool_call: ToolCall) -> int:
        """How many exhaustions of ``tool_call`` were recorded."""
        return self._counts.get(call_fingerprint(tool_call), 0)

    def statistics(self) -> EntropyStatistics:
        """A frozen snapshot of the counters."""
        return EntropyStatistics(
            threshold=self.threshold,
            records=self._records,
            fingerprints=len(self._counts),
            over_threshold=tuple(
                sorted(key for key, count in self._counts.items() if count >= self.threshold)
            ),
        )


@dataclass(frozen=True, slots=True)
class RetryRun:
    """Everything ``SandboxRetryProtocol.run`` did: last result, final decision, all decisions."""

    result: ToolResult
    decision: AttemptDecision
    decisions: tuple[AttemptDecision, ...]
    entropy_flagged: bool = False

    @property
    def attempt_count(self) -> int:
        """Number of attempts made."""
        return len(self.decisions)

    @property
    def exhausted(self) -> bool:
        """True when the attempt budget was used up without success."""
        return self.decision.reason_code in _BUDGET_CODES


class _DecisionLog:
    """Attempt hooks that keep the decisions of the attempts that were retried."""

    __slots__ = ("decisions",)

    def __init__(self) -> None:
        self.decisions: list[AttemptDecision] = []

    async def attempt_started(self, attempt: AttemptRecord) -> None:
        del attempt

    async def retry_scheduled(
        self, attempt: AttemptRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        del attempt, next_attempt_us
        self.decisions.append(decision)


def _no_clock() -> int:
    """The default clock: the protocol's records are not kept, so their times do not matter."""
    return 0


class SandboxRetryProtocol:
    """Runs a tool call with the seed-003 retry protocol over THE attempt loop (`run_attempts`);
    decisions come from ``decide_attempt``."""

    __slots__ = ("_clock", "_delay", "_entropy", "_executor", "options")

    def __init__(
        self,
        executor: SandboxExecutor,
        entropy_detector: EntropyDetector,
        options: RetryOptions | None = None,
        *,
        delay: Callable[[float], Awaitable[None]],
        clock: Callable[[], int] = _no_clock,
    ) -> None:
        self._executor = executor
        self._entropy = entropy_detector
        self.options = RetryOptions() if options is None else options
        self._delay = delay
        self._clock = clock

    async def run(self, tool_call: ToolCall, phase: AgentPhase | None) -> RetryRun:
        """Attempt ``tool_call`` until ``decide_attempt`` stops; never raises on failure.

        The attempts go through THE attempt loop (`run_attempts`): this class only supplies
        "run one attempt" (``executor.execute(tool_call)``, mapped by ``ToolResult.outcome``).
        Records the exhaustion with the entropy detector when the verdict is EXHAUSTED.
        """
        executor = self._executor

        async def one_attempt(attempt: AttemptRecord) -> AttemptReport[ToolResult]:
            del attempt  # every attempt receives the same, frozen tool call
            result = await executor.execute(tool_call)
            return AttemptReport(
                outcome=result.outcome(), payload=result, duration_ms=result.duration_ms
            )

        hooks = _DecisionLog()
        end = await run_attempts(
            one_attempt,
            phase=phase,
            options=self.options,
            clock=self._clock,
            sleep=self._delay,
            hooks=hooks,
            instruction_id=lambda _n: tool_call.id,
        )
        # Neither a drain (should_continue) nor an interrupted attempt is used here.
        assert end is not None
        assert end.report is not None
        decision = end.decision
        flagged = False
        if decision.record_entropy and phase is not None:
            flagged = self._entropy.record(tool_call, phase)
        return RetryRun(
            end.report.payload,
            decision,
            (*hooks.decisions, decision),
            entropy_flagged=flagged,
        )

    async def execute_with_retry(self, tool_call: ToolCall, phase: AgentPhase | None) -> ToolResult:
        """Run ``tool_call``; return the successful (or, when not retried, the last) result.

        Outside GREEN/VERIFY the call runs once and its result is returned, failed or not. Raises
        ``SandboxRetryExhaustedError`` when the attempt budget is used up: after a persistent
        failure (the entropy detector has been notified) or a transient fault (not notified).
        """
        run = await self.run(tool_call, phase)
        if run.exhausted:
            raise SandboxRetryExhaustedError(
                run.result.exit_code,
                run.attempt_count,
                phase,
                tool_call.id,
                reason_code=run.decision.reason_code,
            )
        return run.result
