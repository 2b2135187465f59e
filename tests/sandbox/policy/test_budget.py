"""The daemon-wide retry budget (`sandbox.policy.budget`): pure arithmetic, time passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import AttemptOutcome, RetryOptions, Verdict, decide_attempt
from sandbox.policy.budget import RESOLUTION_MS, BudgetLimits, RetryBudget, over_budget
from sandbox.policy.faults import ExecutionFaultType

#: (milliseconds since the previous event, "first" or "retry")
Events = list[tuple[int, str]]

events_strategy = st.lists(
    st.tuples(st.integers(0, 3000), st.sampled_from(["first", "retry", "retry"])), max_size=200
)
limits_strategy = st.builds(
    BudgetLimits,
    ratio=st.sampled_from([0.0, 0.1, 0.2, 0.5, 1.0, 2.0]),
    window_ms=st.integers(RESOLUTION_MS, 20_000),
    min_retries=st.integers(0, 5),
)


def _in_window(at: int, now: int, window_ms: int) -> bool:
    """The reference window: an event counts while its bucket starts after now - window."""
    return at // RESOLUTION_MS > (now - window_ms) // RESOLUTION_MS


@given(events=events_strategy, limits=limits_strategy)
def test_budget_matches_the_sliding_window_model(events: Events, limits: BudgetLimits) -> None:
    """A retry is granted exactly when the window's granted retries stay within
    min_retries + ratio x first attempts (checked against a model that keeps every event)."""
    budget = RetryBudget()
    now = 0
    log: list[tuple[int, str]] = []  # (time, "first" | granted "retry")
    for gap, kind in events:
        now += gap
        if kind == "first":
            budget.first_attempt(now, limits)
            log.append((now, "first"))
            continue
        recent = [k for at, k in log if _in_window(at, now, limits.window_ms)]
        allowance = limits.min_retries + math.floor(limits.ratio * recent.count("first"))
        expected = recent.count("retry") + 1 <= allowance
        assert budget.try_retry(now, limits) is expected
        if expected:
            log.append((now, "retry"))
        stats = budget.statistics(now, limits)
        if expected:  # when granted, within the allowance (first attempts may expire first)
            assert stats.retries <= stats.allowance
        assert stats.first_attempts == recent.count("first")


@given(events=events_strategy, limits=limits_strategy)
def test_a_quiet_window_restores_the_minimum(events: Events, limits: BudgetLimits) -> None:
    """However the budget was spent, after a whole window without events the minimum
    allowance is available again."""
    budget = RetryBudget()
    now = 0
    for gap, kind in events:
        now += gap
        if kind == "first":
            budget.first_attempt(now, limits)
        else:
            budget.try_retry(now, limits)
    now += limits.window_ms + RESOLUTION_MS
    granted = sum(budget.try_retry(now, limits) for _ in range(limits.min_retries + 3))
    assert granted == limits.min_retries


@given(firsts=st.integers(0, 500), ratio=st.sampled_from([0.0, 0.2, 0.5, 1.0]))
def test_retries_are_a_fraction_of_first_attempts(firsts: int, ratio: float) -> None:
    """With no minimum, n first attempts buy floor(ratio x n) retries in the window: a storm
    (every turn failing) is cut to that fraction."""
    limits = BudgetLimits(ratio=ratio, window_ms=10_000, min_retries=0)
    budget = RetryBudget()
    for _ in range(firsts):
        budget.first_attempt(5, limits)
    granted = sum(budget.try_retry(10, limits) for _ in range(firsts + 5))
    assert granted == math.floor(ratio * firsts)
    assert budget.statistics(10, limits).refused_total == firsts + 5 - granted


def test_a_clock_that_steps_back_is_not_a_way_around_the_budget() -> None:
    """An earlier time counts in the latest bucket: it cannot revive an expired allowance."""
    limits = BudgetLimits(ratio=0.0, window_ms=1000, min_retries=1)
    budget = RetryBudget()
    assert budget.try_retry(5000, limits)
    assert not budget.try_retry(10, limits)


def test_a_zero_window_turns_the_budget_off() -> None:
    """window_ms = 0: every retry is granted."""
    limits = BudgetLimits(ratio=0.0, window_ms=0, min_retries=0)
    budget = RetryBudget()
    assert all(budget.try_retry(t, limits) for t in range(100))
    assert not budget.statistics(100, limits).enabled


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"ratio": -0.1}, r"^ratio must be a finite number >= 0"),
        ({"ratio": math.nan}, r"^ratio must be a finite number >= 0"),
        ({"window_ms": 50}, r"^window_ms must be 0 \(off\) or >= 100"),
        ({"min_retries": -1}, r"^min_retries must be >= 0"),
    ],
)
def test_bad_limits_fail_loudly(changes: dict[str, float], match: str) -> None:
    """Configuration errors raise at construction."""
    with pytest.raises(ValueError, match=match):
        BudgetLimits(**changes)  # type: ignore[arg-type]


def test_over_budget_ends_the_turn_with_its_own_code() -> None:
    """A refused RETRY becomes TERMINATE DAEMON_RETRY_BUDGET_EXHAUSTED; the engine's own answer
    (RETRY, RETRY_LIMITED) stays on the decision for the record."""
    retry = decide_attempt(
        AttemptOutcome.fault(ExecutionFaultType.CRASH),
        phase=None,
        attempt_number=1,
        options=RetryOptions(),
    )
    assert retry.verdict is Verdict.RETRY
    ended = over_budget(retry)
    assert ended.verdict is Verdict.TERMINATE
    assert ended.reason_code == rc.DAEMON_RETRY_BUDGET_EXHAUSTED
    assert ended.delay_ms == 0
    assert ended.fault_type is ExecutionFaultType.CRASH
    assert ended.sandbox_decision is retry.sandbox_decision
    assert "retry budget" in ended.reason
