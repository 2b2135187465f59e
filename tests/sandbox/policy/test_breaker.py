"""The circuit breaker per executor pool (`sandbox.policy.breaker`): a pure state machine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.policy.breaker import (
    BreakerLimits,
    BreakerState,
    CircuitState,
    admit,
    record,
    release,
)

LIMITS = BreakerLimits(faults=3, window_ms=1000, cooldown_ms=5000)

ops_strategy = st.lists(
    st.tuples(st.integers(0, 3000), st.sampled_from(["admit", "fault", "success", "release"])),
    max_size=120,
)
limits_strategy = st.builds(
    BreakerLimits,
    faults=st.integers(1, 5),
    window_ms=st.integers(1, 5000),
    cooldown_ms=st.integers(1, 10_000),
)


def _open_at(now: int) -> BreakerState:
    state = BreakerState()
    for _ in range(LIMITS.faults):
        state = record(state, now, LIMITS, fault=True, probe=False)
    return state


def test_n_faults_in_the_window_open_it_and_it_fails_fast() -> None:
    """Three faults within a second open the breaker; attempts are refused until the
    cool-down has passed."""
    state = _open_at(100)
    assert state.state is CircuitState.OPEN
    admission, state = admit(state, 5099, LIMITS)
    assert not admission.allowed
    assert state.to_dict(5099, LIMITS)["probe_in_ms"] == 1


def test_a_successful_probe_closes_it() -> None:
    """After the cool-down one probe goes; others wait for it; its success closes the breaker."""
    admission, state = admit(_open_at(0), 5000, LIMITS)
    assert admission.allowed
    assert admission.probe
    assert state.state is CircuitState.HALF_OPEN
    other, state = admit(state, 5001, LIMITS)
    assert not other.allowed
    state = record(state, 5002, LIMITS, fault=False, probe=True)
    assert state == BreakerState()
    assert admit(state, 5003, LIMITS)[0].allowed


def test_a_failed_probe_opens_it_for_another_cool_down() -> None:
    """A probe that faults opens the breaker again from that moment."""
    _, state = admit(_open_at(0), 6000, LIMITS)
    state = record(state, 6500, LIMITS, fault=True, probe=True)
    assert (state.state, state.opened_at_ms) == (CircuitState.OPEN, 6500)
    assert not admit(state, 11_499, LIMITS)[0].allowed
    assert admit(state, 11_500, LIMITS)[0].probe


def test_a_released_probe_lets_the_next_attempt_probe() -> None:
    """A probe that reached no executor gives its turn to the next attempt."""
    _, state = admit(_open_at(0), 5000, LIMITS)
    state = release(state)
    admission, state = admit(state, 5001, LIMITS)
    assert admission.allowed
    assert admission.probe


def test_faults_spread_wider_than_the_window_do_not_open_it() -> None:
    """Three faults, each more than a window apart, leave it closed."""
    state = BreakerState()
    for t in (0, 1500, 3000):
        state = record(state, t, LIMITS, fault=True, probe=False)
    assert state.state is CircuitState.CLOSED


def test_the_breaker_off_always_admits() -> None:
    """faults = 0: never opens."""
    off = BreakerLimits(faults=0)
    state = BreakerState()
    for t in range(50):
        state = record(state, t, off, fault=True, probe=False)
        assert admit(state, t, off)[0].allowed
    assert state.state is CircuitState.CLOSED


@given(ops=ops_strategy, limits=limits_strategy)
def test_invariants_over_any_history(ops: list[tuple[int, str]], limits: BreakerLimits) -> None:
    """Whatever happens: an open breaker refuses everything until its cool-down has passed;
    at most one probe is out; a closed breaker opens exactly when `faults` faults fall within
    the window (checked against a model that keeps every fault time)."""
    state = BreakerState()
    now = 0
    probes_out = 0
    closed_faults: list[int] = []
    for gap, op in ops:
        now += gap
        before = state
        if op == "admit":
            admission, state = admit(state, now, limits)
            if before.state is CircuitState.OPEN:
                assert before.opened_at_ms is not None
                assert admission.allowed == (now >= before.opened_at_ms + limits.cooldown_ms)
            if admission.probe:
                probes_out += 1
            assert probes_out <= 1
            if before.state is CircuitState.CLOSED:
                assert admission.allowed
                assert not admission.probe
        elif op == "release":
            state = release(state)
            probes_out = 0
        else:
            probe = probes_out == 1 and state.state is CircuitState.HALF_OPEN
            state = record(state, now, limits, fault=op == "fault", probe=probe)
            if probe:
                probes_out = 0
                expected = CircuitState.OPEN if op == "fault" else CircuitState.CLOSED
                assert state.state is expected
            if before.state is CircuitState.CLOSED and op == "fault":
                closed_faults.append(now)
                recent = [t for t in closed_faults if t > now - limits.window_ms]
                opens = len(recent) >= limits.faults
                assert (state.state is CircuitState.OPEN) == opens
            if state.state is CircuitState.OPEN:
                assert state.opened_at_ms is not None
        if state.state is not CircuitState.CLOSED:
            closed_faults = []  # a breaker closes again with no faults counted
        assert len(state.recent_faults) <= limits.faults


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"faults": -1}, r"^faults must be >= 0"),
        ({"window_ms": 0}, r"^window_ms and cooldown_ms must be >= 1"),
        ({"cooldown_ms": 0}, r"^window_ms and cooldown_ms must be >= 1"),
    ],
)
def test_bad_limits_fail_loudly(changes: dict[str, int], match: str) -> None:
    """Configuration errors raise at construction."""
    with pytest.raises(ValueError, match=match):
        BreakerLimits(**changes)
