"""The hub's circuit breakers: one per executor pool (command type), driven by attempts.

The state machine is pure (`sandbox.policy.breaker`); this module owns one state per command
type, feeds it the monotonic clock and the attempts' results, and logs each transition
(``circuit_opened``, ``circuit_half_open``, ``circuit_closed``). The hub asks `admit` before an
attempt looks for an executor (refused: the attempt fails fast, outcome CIRCUIT_OPEN) and reports
the attempt's end with `record`. What counts as a fault of the pool: an attempt that reached an
executor and ended CRASH, TIMEOUT, INVALID_RESPONSE or PARTIAL. A FAILURE or REFUSED answer is a
working executor saying no; an attempt that never reached an executor (no slot, no executor,
the hub closing) says nothing about the pool (a probe among them is given back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from sandbox.policy.attempts import AttemptOutcome, OutcomeKind
from sandbox.policy.breaker import (
    Admission,
    BreakerLimits,
    BreakerState,
    CircuitState,
    admit,
    record,
    release,
)
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.log import EventLog

__all__ = ["POOL_FAULTS", "Circuits", "monotonic_ms"]

#: Faults of an attempt that reached an executor which count against its pool.
POOL_FAULTS: Final = frozenset(
    {
        ExecutionFaultType.CRASH,
        ExecutionFaultType.TIMEOUT,
        ExecutionFaultType.INVALID_RESPONSE,
        ExecutionFaultType.PARTIAL,
    }
)
_EVENTS: Final = {
    CircuitState.OPEN: "circuit_opened",
    CircuitState.HALF_OPEN: "circuit_half_open",
    CircuitState.CLOSED: "circuit_closed",
}


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Circuits:
    """One breaker per command type; *limits* gives the limits in force (a reload applies)."""

    __slots__ = ("_clock", "_limits", "_log", "_states")

    def __init__(
        self,
        *,
        limits: Callable[[], BreakerLimits],
        log: EventLog,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self._limits = limits
        self._log = log
        self._clock = clock
        self._states: dict[ExecutorCommandType, BreakerState] = {}

    def admit(self, command: ExecutorCommandType) -> Admission:
        """May an attempt of *command* go now (and is it the half-open probe)?"""
        state = self._states.get(command)
        if state is None:
            return Admission(allowed=True)  # closed, no recent fault: the hot path
        admission, new = admit(state, self._clock(), self._limits())
        self._move(command, state, new)
        return admission

    def record(
        self,
        command: ExecutorCommandType,
        outcome: AttemptOutcome,
        *,
        reached_executor: bool,
        probe: bool,
    ) -> None:
        """The end of an attempt admitted by `admit`."""
        limits = self._limits()
        state = self._states.get(command, BreakerState())
        if not reached_executor:
            if probe:
                self._move(command, state, release(state))
            return
        fault = outcome.kind is OutcomeKind.FAULT and outcome.fault_type in POOL_FAULTS
        if not fault and command not in self._states:
            return  # closed with no recent fault, and still fine
        now = self._clock()
        new = record(state, now, limits, fault=fault, probe=probe)
        self._move(command, state, new, fault=outcome.fault_type if fault else None)

    def abandon(self, command: ExecutorCommandType, *, probe: bool) -> None:
        """An admitted attempt was cancelled before it ended: a probe is given back."""
        state = self._states.get(command)
        if probe and state is not None:
            self._move(command, state, release(state))

    def _move(
        self,
        command: ExecutorCommandType,
        old: BreakerState,
        new: BreakerState,
        *,
        fault: ExecutionFaultType | None = None,
    ) -> None:
        if new == BreakerState():
            self._states.pop(command, None)
        else:
            self._states[command] = new
        if new.state is old.state:
            return
        limits = self._limits()
        event = _EVENTS[new.state]
        fields: dict[str, object] = {"command_type": command.value, "previous": old.state.value}
        if new.state is CircuitState.OPEN:
            fields.update(
                faults=limits.faults,
                window_ms=limits.window_ms,
                cooldown_ms=limits.cooldown_ms,
                fault_type=None if fault is None else fault.value,
            )
            self._log.warning(event, **fields)
        else:
            self._log.info(event, **fields)

    def state(self, command: ExecutorCommandType) -> CircuitState:
        state = self._states.get(command)
        return CircuitState.CLOSED if state is None else state.state

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Every breaker that is not closed-and-quiet: state, recent faults, time to a probe."""
        now, limits = self._clock(), self._limits()
        shown: dict[str, dict[str, object]] = {}
        for command, state in sorted(self._states.items(), key=lambda item: item[0].value):
            view = state.to_dict(now, limits)
            if state.state is not CircuitState.CLOSED or view["recent_faults"]:
                shown[command.value] = view
        return shown
