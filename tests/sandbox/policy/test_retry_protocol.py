"""Seed 003 section 1: SandboxRetryProtocol.execute_with_retry (retry-protocol test list)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import AgentPhase, RetryOptions, Verdict
from sandbox.policy.retry_protocol import (
    CountingEntropyDetector,
    EntropyDetector,
    SandboxExecutor,
    SandboxRetryExhaustedError,
    SandboxRetryProtocol,
    ToolCall,
    ToolResult,
)

P = AgentPhase
OK = ToolResult(exit_code=0, stdout="ok")
FAIL = ToolResult(exit_code=1, stderr="compile error")


class ScriptedExecutor:
    """Returns scripted results and records every tool call it was given."""

    def __init__(self, results: Sequence[ToolResult]) -> None:
        self.results = list(results)
        self.calls: list[ToolCall] = []

    async def execute(self, tool_call: ToolCall) -> ToolResult:
        self.calls.append(tool_call)
        return self.results.pop(0)


class RecordingDetector:
    """An EntropyDetector that remembers what it was told."""

    def __init__(self) -> None:
        self.records: list[tuple[ToolCall, AgentPhase]] = []

    def record(self, tool_call: ToolCall, phase: AgentPhase) -> bool:
        self.records.append((tool_call, phase))
        return False


class DelayRecorder:
    """The injected delay: records seconds instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


CALL = ToolCall(id="call-1", name="pytest", arguments={"argv": ["-q", "tests"], "cwd": "ws"})


def _protocol(
    results: Sequence[ToolResult], options: RetryOptions | None = None
) -> tuple[SandboxRetryProtocol, ScriptedExecutor, RecordingDetector, DelayRecorder]:
    executor, detector, delay = ScriptedExecutor(results), RecordingDetector(), DelayRecorder()
    return SandboxRetryProtocol(executor, detector, options, delay=delay), executor, detector, delay


async def test_non_zero_exit_retries_exactly_two_more_times() -> None:
    """A non-zero exit on attempt 1 in GREEN is retried exactly twice more, then fails."""
    protocol, executor, _, _ = _protocol([FAIL, FAIL, FAIL])
    with pytest.raises(SandboxRetryExhaustedError):
        await protocol.execute_with_retry(CALL, P.GREEN)
    assert len(executor.calls) == 3


@pytest.mark.parametrize("phase", [P.GREEN, P.VERIFY])
async def test_retry_happens_in_green_and_verify(phase: AgentPhase) -> None:
    """GREEN and VERIFY retry automatically."""
    protocol, executor, _, _ = _protocol([FAIL, OK])
    assert await protocol.execute_with_retry(CALL, phase) is OK
    assert len(executor.calls) == 2


@pytest.mark.parametrize("phase", [P.RED, P.REFACTOR])
async def test_other_phases_execute_once_and_return(phase: AgentPhase) -> None:
    """RED/REFACTOR execute once and return the failed result: no retry, no exception."""
    protocol, executor, detector, delay = _protocol([FAIL, OK])
    assert await protocol.execute_with_retry(CALL, phase) is FAIL
    assert len(executor.calls) == 1
    assert delay.waits == []
    assert detector.records == []


@pytest.mark.parametrize("phase", [P.RED, P.REFACTOR])
async def test_transient_fault_not_retried_outside_green_verify(phase: AgentPhase) -> None:
    """Even a transient exit (124) is not retried in RED/REFACTOR."""
    timeout = ToolResult(exit_code=124)
    protocol, executor, _, _ = _protocol([timeout, OK])
    assert await protocol.execute_with_retry(CALL, phase) is timeout
    assert len(executor.calls) == 1


async def test_each_retry_receives_identical_arguments() -> None:
    """Every attempt receives the same tool call with identical arguments (idempotency check)."""
    protocol, executor, _, _ = _protocol([FAIL, FAIL, OK])
    await protocol.execute_with_retry(CALL, P.GREEN)
    assert len(executor.calls) == 3
    assert all(call == CALL for call in executor.calls)
    assert {call.arguments["argv"] for call in executor.calls} == {("-q", "tests")}


def test_tool_call_arguments_cannot_be_mutated() -> None:
    """Arguments are deep-frozen, so an executor cannot change what the next attempt receives."""
    call = ToolCall(id="c", name="n", arguments={"argv": ["a"], "env": {"K": "V"}})
    with pytest.raises(TypeError):
        call.arguments["argv"] = ["b"]  # type: ignore[index]
    with pytest.raises(TypeError):
        call.arguments["env"]["K"] = "W"  # type: ignore[index]
    assert call.arguments["argv"] == ("a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.name = "x"  # type: ignore[misc]


async def test_success_on_second_retry_is_returned_as_success() -> None:
    """Success on the second retry is returned as if the first try succeeded (no error)."""
    protocol, executor, detector, _ = _protocol([FAIL, FAIL, OK])
    assert await protocol.execute_with_retry(CALL, P.VERIFY) is OK
    assert len(executor.calls) == 3
    assert detector.records == []


async def test_success_on_first_retry_is_returned() -> None:
    """Success on attempt index 1 is returned with no error propagated."""
    protocol, _, _, _ = _protocol([FAIL, OK])
    assert await protocol.execute_with_retry(CALL, P.GREEN) is OK


async def test_exhaustion_error_carries_full_context() -> None:
    """After 3 failures the error carries exit_code, attempt_count 3, phase and tool_call_id."""
    last = ToolResult(exit_code=2)
    protocol, _, _, _ = _protocol([FAIL, FAIL, last])
    with pytest.raises(SandboxRetryExhaustedError, match=r"^tool call 'call-1' failed 3") as info:
        await protocol.execute_with_retry(CALL, P.GREEN)
    error = info.value
    assert (error.exit_code, error.attempt_count, error.phase, error.tool_call_id) == (
        2,
        3,
        P.GREEN,
        "call-1",
    )
    assert error.reason_code == rc.RETRY_BUDGET_EXHAUSTED


async def test_transient_exhaustion_raises_without_entropy() -> None:
    """Three transient faults (exit 125) raise the same error; the detector is not told."""
    crash = ToolResult(exit_code=125)
    protocol, executor, detector, _ = _protocol([crash, crash, crash])
    with pytest.raises(SandboxRetryExhaustedError) as info:
        await protocol.execute_with_retry(CALL, P.GREEN)
    assert info.value.reason_code == rc.CRASH_RETRY_LIMIT_REACHED
    assert len(executor.calls) == 3
    assert detector.records == []


async def test_no_phase_retries_faults_but_not_failures() -> None:
    """With no phase Phase-21 alone decides: a CRASH is retried, a plain failure is not."""
    crash = ToolResult(exit_code=None, killed_by_signal=9)
    protocol, executor, _, _ = _protocol([crash, OK])
    assert await protocol.execute_with_retry(CALL, None) is OK
    assert len(executor.calls) == 2
    protocol, executor, _, _ = _protocol([FAIL, OK])
    assert await protocol.execute_with_retry(CALL, None) is FAIL
    assert len(executor.calls) == 1


@pytest.mark.parametrize(
    ("result", "verdict", "code"),
    [
        (
            ToolResult(exit_code=1, security_violation=True),
            Verdict.TERMINATE,
            rc.SECURITY_VIOLATION_TERMINATE,
        ),
        (
            ToolResult(exit_code=137, resource_exhausted=True),
            Verdict.ESCALATE,
            rc.RESOURCE_EXHAUSTED_ESCALATE,
        ),
    ],
)
async def test_non_retryable_faults_stop_at_once(
    result: ToolResult, verdict: Verdict, code: str
) -> None:
    """A breach or a resource limit stops after one attempt; run() reports the verdict."""
    protocol, executor, _, _ = _protocol([result, OK])
    run = await protocol.run(CALL, P.GREEN)
    assert (run.decision.verdict, run.decision.reason_code) == (verdict, code)
    assert run.attempt_count == 1
    assert not run.exhausted
    assert len(executor.calls) == 1
    protocol, _, _, _ = _protocol([result])
    assert await protocol.execute_with_retry(CALL, P.GREEN) is result


async def test_run_reports_every_decision() -> None:
    """run() returns the last result, the final decision and one decision per attempt."""
    protocol, _, _, _ = _protocol([FAIL, ToolResult(exit_code=124), OK])
    run = await protocol.run(CALL, P.GREEN)
    assert [d.verdict for d in run.decisions] == [Verdict.RETRY, Verdict.RETRY, Verdict.SUCCEED]
    assert run.result is OK
    assert not run.entropy_flagged


async def test_run_flags_entropy_threshold() -> None:
    """run() reports the detector's 'threshold crossed' answer."""
    executor = ScriptedExecutor([FAIL] * 3)
    detector = CountingEntropyDetector(threshold=1)
    protocol = SandboxRetryProtocol(executor, detector, delay=DelayRecorder())
    run = await protocol.run(CALL, P.GREEN)
    assert run.exhausted
    assert run.entropy_flagged


async def test_budget_comes_from_options() -> None:
    """max_attempts in RetryOptions is the attempt budget."""
    protocol, executor, _, delay = _protocol([FAIL] * 5, RetryOptions(max_attempts=5))
    with pytest.raises(SandboxRetryExhaustedError) as info:
        await protocol.execute_with_retry(CALL, P.GREEN)
    assert info.value.attempt_count == 5
    assert len(executor.calls) == 5
    assert delay.waits == [0.5, 1.0, 2.0, 4.0]


def test_default_options_and_protocols() -> None:
    """Default options are the seed's (3 attempts, 500 ms x 2); fakes satisfy the Protocols."""
    protocol, executor, detector, _ = _protocol([])
    assert protocol.options == RetryOptions(max_attempts=3, base_delay_ms=500, backoff_multiplier=2)
    assert isinstance(executor, SandboxExecutor)
    assert isinstance(detector, EntropyDetector)


def test_error_without_phase_has_readable_message() -> None:
    """SandboxRetryExhaustedError names 'none' for a missing phase."""
    error = SandboxRetryExhaustedError(124, 3, None, "c")
    assert str(error) == (
        "tool call 'c' failed 3 attempt(s) in phase none "
        "(last exit code 124, RETRY_BUDGET_EXHAUSTED)"
    )
