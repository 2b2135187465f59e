"""THE attempt loop (sandbox/policy/attempt_loop.py) with fake runners, a counter clock and a
sleep that records its delays instead of waiting."""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempt_loop import AttemptReport, LoopEnd, run_attempts
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    RetryOptions,
    Verdict,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.lifecycle import TurnState

OK = AttemptOutcome.success()
FAIL = AttemptOutcome.failure(1, "exit code 1")
CRASH = AttemptOutcome.fault(ExecutionFaultType.CRASH, "killed by signal 9")
EXHAUSTED = AttemptOutcome.fault(ExecutionFaultType.RESOURCE_EXHAUSTED, "oom")


class Clock:
    """Integer microseconds; every reading advances it by 1 ms, every sleep by the delay."""

    def __init__(self, start_us: int = 1_000_000) -> None:
        self.now = start_us

    def __call__(self) -> int:
        self.now += 1000
        return self.now


class Sleeper:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.now += round(seconds * 1_000_000)


class Runner:
    """Reports scripted outcomes; remembers the attempts it was asked to run."""

    def __init__(self, outcomes: Sequence[AttemptOutcome]) -> None:
        self.outcomes = list(outcomes)
        self.seen: list[AttemptRecord] = []

    async def __call__(self, attempt: AttemptRecord) -> AttemptReport[int]:
        self.seen.append(attempt)
        return AttemptReport(
            outcome=self.outcomes.pop(0),
            payload=attempt.attempt,
            executor_id="exec-a",
            detail=f"ran {attempt.attempt}",
            duration_ms=7,
            extra=MappingProxyType({"n": attempt.attempt}),
        )


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.scheduled: list[tuple[AttemptRecord, AttemptDecision, int]] = []
        self.fail_on: str | None = None

    async def attempt_started(self, attempt: AttemptRecord) -> None:
        self.calls.append(("started", attempt.attempt))
        if self.fail_on == "started":
            raise RuntimeError("store refused the claim")

    async def retry_scheduled(
        self, attempt: AttemptRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        self.calls.append(("retry", attempt.attempt))
        self.scheduled.append((attempt, decision, next_attempt_us))
        if self.fail_on == "retry":
            raise RuntimeError("fenced")


async def _loop(
    outcomes: Sequence[AttemptOutcome],
    phase: AgentPhase | None = AgentPhase.GREEN,
    *,
    options: RetryOptions | None = None,
    hooks: Hooks | None = None,
    **kwargs: object,
) -> tuple[LoopEnd[int] | None, Runner, Sleeper, Hooks]:
    clock = Clock()
    sleep = Sleeper(clock)
    runner = Runner(outcomes)
    hooks = hooks or Hooks()
    end = await run_attempts(
        runner,
        phase=phase,
        options=options or RetryOptions(),
        clock=clock,
        sleep=sleep,
        hooks=hooks,
        **kwargs,  # type: ignore[arg-type]
    )
    return end, runner, sleep, hooks


async def test_seed_schedule_three_attempts_in_green() -> None:
    """Three failures in GREEN: waits of 500 and 1000 ms, then EXHAUSTED."""
    end, runner, sleep, hooks = await _loop([FAIL, FAIL, FAIL])
    assert end is not None
    assert sleep.delays == [0.5, 1.0]
    assert [a.attempt for a in runner.seen] == [1, 2, 3]
    assert end.state is TurnState.EXHAUSTED
    assert end.decision.verdict is Verdict.EXHAUSTED
    assert end.decision.record_entropy
    assert [a.decision for a in end.attempts] == ["RETRY", "RETRY", "EXHAUSTED"]
    assert [a.delay_ms for a in end.attempts] == [500, 1000, None]
    assert hooks.calls == [
        ("started", 1),
        ("retry", 1),
        ("started", 2),
        ("retry", 2),
        ("started", 3),
    ]
    assert end.report is not None
    assert end.report.payload == 3


async def test_success_after_retries_returns_the_last_report() -> None:
    end, runner, sleep, _ = await _loop([FAIL, CRASH, OK])
    assert end is not None
    assert end.state is TurnState.SUCCEEDED
    assert end.outcome == OK
    assert sleep.delays == [0.5, 1.0]
    assert end.report is not None
    assert end.report.payload == 3
    assert len(runner.seen) == 3


@pytest.mark.parametrize("phase", [AgentPhase.RED, AgentPhase.REFACTOR])
async def test_phase_gate_ends_the_turn_outside_green_and_verify(phase: AgentPhase) -> None:
    end, runner, sleep, hooks = await _loop([FAIL, OK], phase)
    assert end is not None
    assert end.state is TurnState.FAILED
    assert end.decision.reason_code == rc.PHASE_NOT_RETRYABLE
    assert (len(runner.seen), sleep.delays) == (1, [])
    assert hooks.scheduled == []
    end, _, _, _ = await _loop([CRASH, OK], phase)
    assert end is not None
    assert (end.state, end.decision.reason_code) == (TurnState.TERMINATED, rc.PHASE_NOT_RETRYABLE)


async def test_interrupted_attempt_is_a_crash_and_retried() -> None:
    """Resuming a turn whose attempt 1 was interrupted: CRASH -> RETRY, attempt 2 runs."""
    interrupted = AttemptRecord(attempt=1, started_us=5, instruction_id="t#1")
    end, runner, sleep, hooks = await _loop([OK], interrupted=interrupted)
    assert end is not None
    assert [a.attempt for a in runner.seen] == [2]
    first, second = end.attempts
    assert (first.outcome, first.fault_type, first.decision) == ("FAULT", "CRASH", "RETRY")
    assert first.reason_code == rc.RETRY_AFTER_CRASH
    assert first.instruction_id == "t#1"
    assert first.detail is not None
    assert "interrupted" in first.detail
    assert second.decision == "SUCCEED"
    assert sleep.delays == [0.5]
    assert hooks.calls == [("retry", 1), ("started", 2)]
    assert end.state is TurnState.SUCCEEDED


async def test_interrupted_last_attempt_ends_the_turn() -> None:
    """An interrupted last attempt is a CRASH at the budget: TERMINATE, nothing runs."""
    interrupted = AttemptRecord(attempt=3, started_us=5)
    end, runner, sleep, hooks = await _loop([], interrupted=interrupted)
    assert end is not None
    assert runner.seen == []
    assert (end.state, end.decision.reason_code) == (
        TurnState.TERMINATED,
        rc.CRASH_RETRY_LIMIT_REACHED,
    )
    assert end.report is None
    assert end.outcome.fault_type is ExecutionFaultType.CRASH
    assert (sleep.delays, hooks.calls) == ([], [])


async def test_resume_at_waits_the_rest_of_the_backoff() -> None:
    """A turn parked in waiting_retry resumes after the rest of its backoff, then runs."""
    end, runner, sleep, _ = await _loop([OK], first_attempt=2, resume_at_us=1_301_000)
    assert end is not None
    assert sleep.delays == [pytest.approx(0.3)]
    assert [a.attempt for a in runner.seen] == [2]
    assert end.attempts[0].attempt == 2


async def test_resume_at_in_the_past_does_not_wait() -> None:
    end, _, sleep, _ = await _loop([OK], first_attempt=2, resume_at_us=10)
    assert end is not None
    assert sleep.delays == []


async def test_should_continue_false_returns_none() -> None:
    end, runner, sleep, hooks = await _loop([OK], should_continue=lambda: False)
    assert end is None
    assert (runner.seen, sleep.delays, hooks.calls) == ([], [], [])


async def test_should_continue_is_asked_before_each_new_attempt() -> None:
    answers = iter([True, False])
    end, runner, sleep, _ = await _loop([FAIL, OK], should_continue=lambda: next(answers))
    assert end is None  # drained after attempt 1 decided RETRY and its backoff
    assert len(runner.seen) == 1
    assert sleep.delays == [0.5]


@pytest.mark.parametrize("where", ["started", "retry"])
async def test_hook_exceptions_propagate(where: str) -> None:
    hooks = Hooks()
    hooks.fail_on = where
    with pytest.raises(RuntimeError):
        await _loop([FAIL, OK], hooks=hooks)


async def test_runner_exceptions_propagate() -> None:
    async def broken(attempt: AttemptRecord) -> AttemptReport[int]:
        raise OSError("launcher gone")

    with pytest.raises(OSError, match="launcher gone"):
        await run_attempts(
            broken,
            phase=None,
            options=RetryOptions(),
            clock=Clock(),
            sleep=Sleeper(Clock()),
            hooks=Hooks(),
        )


@pytest.mark.parametrize("before", [0, 1, 2])
async def test_resource_exhausted_escalates_at_any_attempt(before: int) -> None:
    end, runner, _, _ = await _loop([CRASH] * before + [EXHAUSTED])
    assert end is not None
    assert end.state is TurnState.ESCALATED
    assert end.decision.verdict is Verdict.ESCALATE
    assert end.decision.reason_code == rc.RESOURCE_EXHAUSTED_ESCALATE
    assert len(runner.seen) == before + 1


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
@pytest.mark.parametrize("failing", [FAIL, CRASH], ids=["failure", "crash"])
async def test_a_turn_gets_exactly_max_attempts_attempts(
    max_attempts: int, failing: AttemptOutcome
) -> None:
    """max_retries is the attempt budget: max_attempts attempts in all (max_attempts - 1
    retries), the last one decided by the table (EXHAUSTED / CRASH_RETRY_LIMIT_REACHED)."""
    options = RetryOptions(max_attempts=max_attempts, base_delay_ms=0)
    end, runner, _, _ = await _loop([failing] * 10, options=options)
    assert end is not None
    assert [a.attempt for a in runner.seen] == list(range(1, max_attempts + 1))
    decisions = [a.decision for a in end.attempts]
    last = "EXHAUSTED" if failing is FAIL else "TERMINATE"
    assert decisions == ["RETRY"] * (max_attempts - 1) + [last]
    assert end.decision.reason_code in {rc.RETRY_BUDGET_EXHAUSTED, rc.CRASH_RETRY_LIMIT_REACHED}


async def test_resource_exhausted_beyond_the_budget_escalates() -> None:
    """A turn resumed beyond its budget (max_attempts lowered across a restart): attempt 4 of 3
    hitting RESOURCE_EXHAUSTED escalates (seed 000 "Any"); a success there is still an overrun."""
    end, runner, _, _ = await _loop([EXHAUSTED], first_attempt=4)
    assert end is not None
    assert [a.attempt for a in runner.seen] == [4]
    assert (end.state, end.decision.reason_code) == (
        TurnState.ESCALATED,
        rc.RESOURCE_EXHAUSTED_ESCALATE,
    )
    end, _, _, _ = await _loop([OK], first_attempt=4)
    assert end is not None
    assert (end.state, end.decision.reason_code) == (
        TurnState.TERMINATED,
        rc.DENY_ATTEMPT_LIMIT_EXCEEDED,
    )


async def test_records_carry_decisions_delays_and_reports() -> None:
    end, _, _, hooks = await _loop(
        [FAIL, OK], execution_id="sess", instruction_id=lambda n: f"sess#4.{n}"
    )
    assert end is not None
    first, second = end.attempts
    assert first.to_dict() | {"started_us": 0, "finished_us": 0} == {
        "attempt": 1,
        "executor_id": "exec-a",
        "instruction_id": "sess#4.1",
        "started_us": 0,
        "finished_us": 0,
        "outcome": "FAILURE",
        "fault_type": None,
        "exit_code": 1,
        "decision": "RETRY",
        "reason_code": rc.PERSISTENT_FAILURE_RETRY,
        "reason": first.reason,
        "detail": "ran 1",
        "duration_ms": 7,
        "delay_ms": 500,
        "extra": {"n": 1},
    }
    assert first.finished
    assert first.finished_us is not None
    assert first.finished_us >= first.started_us
    assert (second.decision, second.reason_code, second.delay_ms) == (
        "SUCCEED",
        rc.ATTEMPT_SUCCEEDED,
        None,
    )
    record, decision, next_us = hooks.scheduled[0]
    assert record == first
    assert decision.delay_ms == 500
    assert first.finished_us is not None
    assert next_us >= first.finished_us + 500_000


async def test_no_phase_retries_faults_only() -> None:
    end, runner, _, _ = await _loop([CRASH, OK], None)
    assert end is not None
    assert (end.state, len(runner.seen)) == (TurnState.SUCCEEDED, 2)
    end, runner, _, _ = await _loop([FAIL, OK], None)
    assert end is not None
    assert (end.state, end.decision.reason_code) == (TurnState.FAILED, rc.FAILURE_NOT_RETRIED)


async def test_zero_delay_does_not_sleep() -> None:
    end, _, sleep, _ = await _loop([FAIL, OK], options=RetryOptions(base_delay_ms=0))
    assert end is not None
    assert end.state is TurnState.SUCCEEDED
    assert sleep.delays == []
