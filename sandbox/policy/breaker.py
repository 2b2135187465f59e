"""A circuit breaker per executor pool (per command type): a pure state machine.

When the executors of one command type keep failing (crashes, timeouts, invalid answers), every
new instruction of that type only adds load and waits to fail. After ``faults`` faults within
``window_ms`` the breaker **opens**: attempts of that type fail fast (``CIRCUIT_OPEN``) without
reaching an executor. After ``cooldown_ms`` the next attempt is let through alone as a **probe**
(half-open); its success **closes** the breaker, its fault opens it again for another cool-down.

    CLOSED --(faults-th fault within window)--> OPEN --(cool-down passed, attempt)--> HALF_OPEN
    HALF_OPEN --(probe succeeded)--> CLOSED          HALF_OPEN --(probe faulted)--> OPEN

States are frozen values and every move is a function ``(state, now_ms, limits, ...) -> state``
(h11's ``_state.py`` is the model): no I/O, no clock reads (the caller passes a monotonic time in
milliseconds), so the property tests drive it through any history. ``admit`` says whether an
attempt may go now (and whether it is the probe); ``record`` takes the attempt's result;
``release`` gives back a probe that ended with no verdict on the pool (it never reached an
executor). Results of attempts admitted before the breaker opened are ignored while it is open
or half-open: only the probe decides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum, unique

__all__ = [
    "Admission",
    "BreakerLimits",
    "BreakerState",
    "CircuitState",
    "admit",
    "record",
    "release",
]


@unique
class CircuitState(Enum):
    """Where a breaker stands (values as written to status, logs and metrics)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def gauge(self) -> int:
        """0 closed, 1 half-open, 2 open (the metric's value)."""
        return {"closed": 0, "half_open": 1, "open": 2}[self.value]


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerLimits:
    """``faults`` within ``window_ms`` open the breaker (0: never, the breaker is off);
    ``cooldown_ms`` after opening, one probe is let through.

    Raises ``ValueError`` for a negative count or a window/cool-down below 1 ms.
    """

    faults: int = 0
    window_ms: int = 10_000
    cooldown_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.faults < 0:
            msg = f"faults must be >= 0, got {self.faults}"
            raise ValueError(msg)
        if self.window_ms < 1 or self.cooldown_ms < 1:
            msg = (
                f"window_ms and cooldown_ms must be >= 1, got {self.window_ms}, {self.cooldown_ms}"
            )
            raise ValueError(msg)

    @property
    def enabled(self) -> bool:
        return self.faults > 0


@dataclass(frozen=True, slots=True)
class BreakerState:
    """One breaker: its state, the times of recent faults (closed), when it opened, whether
    the half-open probe is out."""

    state: CircuitState = CircuitState.CLOSED
    recent_faults: tuple[int, ...] = ()
    opened_at_ms: int | None = None
    probe_out: bool = False

    def to_dict(self, now_ms: int, limits: BreakerLimits) -> dict[str, object]:
        """Status form: the state, faults in the window, and (open) how long until a probe."""
        recent = sum(1 for t in self.recent_faults if t > now_ms - limits.window_ms)
        probe_in_ms = None
        if self.state is CircuitState.OPEN and self.opened_at_ms is not None:
            probe_in_ms = max(0, self.opened_at_ms + limits.cooldown_ms - now_ms)
        return {"state": self.state.value, "recent_faults": recent, "probe_in_ms": probe_in_ms}


@dataclass(frozen=True, slots=True)
class Admission:
    """``admit``'s answer: may the attempt go, is it the half-open probe."""

    allowed: bool
    probe: bool = False


_CLOSED = BreakerState()


def admit(
    state: BreakerState, now_ms: int, limits: BreakerLimits
) -> tuple[Admission, BreakerState]:
    """May an attempt go now? Closed (or the breaker off): yes. Open: no, until the cool-down
    has passed; then this attempt is the probe (the breaker turns half-open). Half-open: no
    while the probe is out."""
    if not limits.enabled or state.state is CircuitState.CLOSED:
        return Admission(allowed=True), state
    if state.state is CircuitState.OPEN:
        opened = state.opened_at_ms if state.opened_at_ms is not None else now_ms
        if now_ms < opened + limits.cooldown_ms:
            return Admission(allowed=False), state
        return Admission(allowed=True, probe=True), BreakerState(
            CircuitState.HALF_OPEN, opened_at_ms=state.opened_at_ms, probe_out=True
        )
    if state.probe_out:  # HALF_OPEN
        return Admission(allowed=False), state
    return Admission(allowed=True, probe=True), replace(state, probe_out=True)


def record(
    state: BreakerState, now_ms: int, limits: BreakerLimits, *, fault: bool, probe: bool
) -> BreakerState:
    """The result of an attempt that reached an executor: *fault* (CRASH, TIMEOUT, an invalid
    or partial answer) or not; *probe* when ``admit`` let it through as the probe."""
    if not limits.enabled:
        return _CLOSED
    if state.state is CircuitState.HALF_OPEN:
        if not probe:
            return state  # admitted before the breaker opened: only the probe decides
        if fault:
            return BreakerState(CircuitState.OPEN, opened_at_ms=now_ms)
        return _CLOSED
    if state.state is CircuitState.OPEN or not fault:
        return state
    horizon = now_ms - limits.window_ms
    recent = (*(t for t in state.recent_faults if t > horizon), now_ms)
    if len(recent) >= limits.faults:
        return BreakerState(CircuitState.OPEN, opened_at_ms=now_ms)
    return BreakerState(CircuitState.CLOSED, recent_faults=recent[-limits.faults :])


def release(state: BreakerState) -> BreakerState:
    """The probe ended without a verdict on the pool (no executor reached): the next attempt
    may probe instead."""
    if state.state is CircuitState.HALF_OPEN:
        return replace(state, probe_out=False)
    return state
