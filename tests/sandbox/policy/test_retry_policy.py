"""Phase-21 is_retry_allowed / enforce_retry_limit: max_retries is the attempt budget.

Both predicates are True only while ``attempt_number < max_retries`` (the seed authors' test):
attempts are numbered from 1, so with the seed budget of 3 attempts 1 and 2 may be retried and
attempt 3 is the last. ``retry_limit_overrun`` is the separate guard for an attempt beyond the
budget (one that should never have run).
"""

from __future__ import annotations

import pytest

from sandbox.policy.attempts import RetryOptions
from sandbox.policy.context import SandboxContext
from sandbox.policy.engine import enforce_retry_limit, is_retry_allowed, retry_limit_overrun


def _ctx(attempt: object = 1, max_retries: object = 3, **changes: object) -> SandboxContext:
    fields: dict[str, object] = {
        "execution_id": "EXE-1",
        "instruction_id": "INS-1",
        "attempt_number": attempt,
        "max_retries": max_retries,
        "timeout_ms": 1000,
        "timestamp": "t",
    }
    fields.update(changes)
    return SandboxContext(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempt", "allowed"), [(1, True), (2, True), (3, False), (4, False), (99, False)]
)
def test_retry_allowed_while_attempt_below_budget(attempt: int, allowed: bool) -> None:
    """Attempts count from 1; a retry is allowed while attempt_number < max_retries (3)."""
    assert is_retry_allowed(_ctx(attempt)) is allowed


@pytest.mark.parametrize(
    ("attempt", "within"), [(1, True), (2, True), (3, False), (4, False), (1000, False)]
)
def test_enforce_retry_limit_true_only_below_budget(attempt: int, within: bool) -> None:
    """enforce_retry_limit is True only while attempt_number < max_retries (3)."""
    assert enforce_retry_limit(_ctx(attempt)) is within


def test_enforce_retry_limit_seed_authors_case() -> None:
    """The seed authors' own case, literally: attempt_number == max_retries -> False."""
    assert enforce_retry_limit(_ctx(attempt=3, max_retries=3)) is False
    assert enforce_retry_limit(_ctx(attempt=2, max_retries=3)) is True
    assert enforce_retry_limit(_ctx(attempt=4, max_retries=3)) is False


@pytest.mark.parametrize("max_retries", [1, 2, 3, 5, 10])
def test_the_two_predicates_agree(max_retries: int) -> None:
    """is_retry_allowed and enforce_retry_limit give the same answer for every attempt."""
    for attempt in range(1, max_retries + 3):
        context = _ctx(attempt, max_retries)
        assert enforce_retry_limit(context) is is_retry_allowed(context)
        assert enforce_retry_limit(context) is (attempt < max_retries)


@pytest.mark.parametrize(
    ("attempt", "overrun"), [(1, False), (2, False), (3, False), (4, True), (1000, True)]
)
def test_retry_limit_overrun_only_beyond_budget(attempt: int, overrun: bool) -> None:
    """retry_limit_overrun is True only for attempt_number > max_retries (never for the last)."""
    assert retry_limit_overrun(_ctx(attempt)) is overrun


def test_at_most_three_attempts_with_the_seed_budget() -> None:
    """With max_retries = 3 exactly three attempts run: two retries after the first."""
    attempts = 1
    while enforce_retry_limit(_ctx(attempts)):
        attempts += 1
    assert attempts == 3
    assert not retry_limit_overrun(_ctx(attempts))


def test_single_attempt_budget_never_retries() -> None:
    """max_retries = 1 means one attempt and no retry."""
    assert not is_retry_allowed(_ctx(1, 1))
    assert not enforce_retry_limit(_ctx(1, 1))
    assert not retry_limit_overrun(_ctx(1, 1))


@pytest.mark.parametrize(
    "context",
    [
        None,
        "ctx",
        _ctx(0),
        _ctx(-1),
        _ctx(True),
        _ctx(1.0),
        _ctx("1"),
        _ctx(1, 0),
        _ctx(1, "3"),
        _ctx(1, 3, timeout_ms=0),
        _ctx(1, 3, execution_id=None),
    ],
)
def test_malformed_context_allows_nothing(context: object) -> None:
    """A malformed context allows no retry (and is not judged an overrun: it is denied)."""
    assert is_retry_allowed(context) is False
    assert enforce_retry_limit(context) is False
    assert retry_limit_overrun(context) is False


# ----------------------------------------------------------------- backoff (RetryOptions)
def test_seed_backoff_schedule() -> None:
    """Default backoff: 500 ms after attempt 1, 1000 ms after attempt 2 (500 x 2)."""
    options = RetryOptions()
    assert (options.max_attempts, options.jitter) == (3, 0.0)
    assert [options.delay_ms(n) for n in (1, 2, 3, 4)] == [500, 1000, 2000, 4000]


def test_backoff_is_capped() -> None:
    """The delay never exceeds max_delay_ms, even for huge attempt numbers."""
    options = RetryOptions(max_delay_ms=3000)
    assert options.delay_ms(3) == 2000
    assert options.delay_ms(4) == 3000
    assert options.delay_ms(10**9) == 3000
    assert RetryOptions(base_delay_ms=5000, max_delay_ms=1000).delay_ms(1) == 1000


def test_constant_and_zero_backoff() -> None:
    """Multiplier 1 keeps the base delay; base 0 means no wait (fast, no loop)."""
    assert RetryOptions(backoff_multiplier=1).delay_ms(10**9) == 500
    assert RetryOptions(base_delay_ms=0).delay_ms(10**9) == 0
    assert RetryOptions(backoff_multiplier=1.5).delay_ms(3) == 1125


def test_jitter_uses_the_injected_random() -> None:
    """Jitter j scales the delay by [1 - j, 1 + j) using the injected random source."""
    options = RetryOptions(jitter=0.5)
    assert options.delay_ms(1, rand=lambda: 0.0) == 250
    assert options.delay_ms(1, rand=lambda: 0.5) == 500
    assert options.delay_ms(2, rand=lambda: 0.999) == 1499
    assert 250 <= options.delay_ms(1) <= 750  # [250, 750) before rounding to whole ms
    capped = RetryOptions(jitter=1.0, max_delay_ms=600)
    assert capped.delay_ms(1, rand=lambda: 0.99) == 600


@pytest.mark.parametrize("attempt", [0, -1, 1.0, "1"])
def test_delay_needs_a_real_attempt_number(attempt: object) -> None:
    """delay_ms rejects attempt numbers that are not ints >= 1."""
    with pytest.raises(ValueError, match=r"^attempt_number must be an int >= 1, got "):
        RetryOptions().delay_ms(attempt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "error", "pattern"),
    [
        ({"max_attempts": 0}, ValueError, r"^max_attempts must be >= 1, got 0$"),
        ({"max_attempts": "3"}, TypeError, r"^max_attempts must be an int, got '3'$"),
        ({"base_delay_ms": True}, TypeError, r"^base_delay_ms must be an int, got True$"),
        ({"base_delay_ms": -1}, ValueError, r"^base_delay_ms and max_delay_ms must be >= 0$"),
        ({"max_delay_ms": -1}, ValueError, r"^base_delay_ms and max_delay_ms must be >= 0$"),
        ({"backoff_multiplier": 0.5}, ValueError, r"^backoff_multiplier must be >= 1, got 0.5$"),
        ({"backoff_multiplier": float("nan")}, ValueError, r"^backoff_multiplier must be >= 1"),
        ({"jitter": 1.5}, ValueError, r"^jitter must be a fraction in 0..1, got 1.5$"),
        ({"jitter": -0.1}, ValueError, r"^jitter must be a fraction in 0..1, got -0.1$"),
    ],
)
def test_bad_options_fail_loudly(
    changes: dict[str, object], error: type[Exception], pattern: str
) -> None:
    """RetryOptions rejects a configuration that would break the budget or the schedule."""
    with pytest.raises(error, match=pattern):
        RetryOptions(**changes)  # type: ignore[arg-type]


def test_options_are_keyword_only_and_frozen() -> None:
    """RetryOptions takes keyword arguments only and cannot be changed."""
    with pytest.raises(TypeError):
        RetryOptions(5)  # type: ignore[call-arg]
    options = RetryOptions()
    with pytest.raises(AttributeError):
        options.max_attempts = 9  # type: ignore[misc]
