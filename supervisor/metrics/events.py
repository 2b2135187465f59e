"""The metrics that count events as they happen: turn endings, attempt decisions and queue
waits, escalations, sandbox violations, ledger appends, syncs and verifications.

`EventMetrics` implements the turn tracker's `TurnEvents` sink (the turn core calls it on the
event loop) and takes the ledger syncer's per-batch timings (on the syncer's thread:
prometheus-client's metrics lock internally). Everything else is read from the daemon's
statistics at scrape time (`supervisor.metrics.collector`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from supervisor.store.protocol import TurnRecord

__all__ = ["LEDGER_SYNC_BUCKETS", "QUEUE_WAIT_BUCKETS", "TURN_DURATION_BUCKETS", "EventMetrics"]

#: Seconds, from a quick instruction (milliseconds) to a long process turn or an escalation.
TURN_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip
#: Seconds per group-commit batch of ledger files (fdatasync or syncfs).
LEDGER_SYNC_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
#: Seconds an attempt waited before it ran: none (most), a moment, up to `queue_wait_s` for an
#: executor slot, or behind a long process turn of the same session.
QUEUE_WAIT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    1800.0,
)  # fmt: skip
#: The label value for "no fault" (a plain failure or a success has no fault type).
NO_FAULT: Final = "none"


_Child_co = TypeVar("_Child_co", covariant=True)


class _Labelled(Protocol[_Child_co]):
    def labels(self, *values: str) -> _Child_co: ...


class _Children(Generic[_Child_co]):
    """A metric's labelled children, kept once made: prometheus-client checks the label values
    and takes its lock at every `labels` call, which the turn path made several times a turn."""

    def __init__(self, metric: _Labelled[_Child_co]) -> None:
        self._metric = metric
        self._made: dict[tuple[str, ...], _Child_co] = {}

    def __call__(self, *values: str) -> _Child_co:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child


def _fault(attempt_or_turn: AttemptRecord | TurnRecord) -> str:
    return attempt_or_turn.fault_type or NO_FAULT


class EventMetrics:
    """Counters and histograms fed by the turn core's events (`TurnEvents`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.turn_duration = Histogram(
            "hunter_turn_duration_seconds",
            "Time from a turn's acceptance to its final state.",
            ("kind", "state"),
            buckets=TURN_DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "hunter_attempt_queue_wait_seconds",
            "Time an attempt waited before it ran: for an executor slot of its command type, "
            "or (process) for its session's lock and a process slot.",
            ("command_type",),
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.attempts = Counter(
            "hunter_attempts",
            "Attempts decided, by outcome and decision.",
            ("outcome", "decision"),
            registry=registry,
        )
        self.retries = Counter(
            "hunter_retries",
            "Attempts decided RETRY, by fault type ('none' for a plain failure).",
            ("fault_type",),
            registry=registry,
        )
        self.faults = Counter(
            "hunter_faults",
            "Attempts that ended in a fault, by fault type and decision.",
            ("fault_type", "decision"),
            registry=registry,
        )
        self.escalations = Counter(
            "hunter_escalations",
            "Turns escalated to an operator, by fault type.",
            ("fault_type",),
            registry=registry,
        )
        self.escalations.labels(fault_type="RESOURCE_EXHAUSTED")  # the seed's escalating fault
        self.violations = Counter(
            "hunter_sandbox_violations",
            "Capability violations found by the sandbox (at intake or after a process turn), "
            "by the capability violated.",
            ("capability",),
            registry=registry,
        )
        self.ledger_appends = Counter(
            "hunter_ledger_appends",
            "Ledger lines committed with turn endings, by ledger (exec, evidence).",
            ("ledger",),
            registry=registry,
        )
        for ledger in ("exec", "evidence"):
            self.ledger_appends.labels(ledger=ledger)
        self.ledger_sync = Histogram(
            "hunter_ledger_sync_seconds",
            "Time to make one group-commit batch of ledger files durable.",
            buckets=LEDGER_SYNC_BUCKETS,
            registry=registry,
        )
        self.verifications = Counter(
            "hunter_ledger_verifications",
            "Ledgers checked by the daemon's verification requests (control op ledger.verify).",
            registry=registry,
        )
        self.verify_failures = Counter(
            "hunter_ledger_verify_failures",
            "Sessions whose ledgers failed verification (a broken hash, link or head).",
            registry=registry,
        )
        self._durations = _Children(self.turn_duration)
        self._waits = _Children(self.queue_wait)
        self._attempts = _Children(self.attempts)
        self._retries = _Children(self.retries)
        self._faults = _Children(self.faults)
        self._escalations = _Children(self.escalations)
        self._violations = _Children(self.violations)
        self._appends = _Children(self.ledger_appends)

    # -- TurnEvents ------------------------------------------------------------------------

    def attempt_decided(self, attempt: AttemptRecord) -> None:
        decision = attempt.decision or "NONE"
        self._attempts(attempt.outcome or "NONE", decision).inc()
        if decision == "RETRY":
            self._retries(_fault(attempt)).inc()
        if attempt.outcome == "FAULT":
            self._faults(_fault(attempt), decision).inc()

    def attempt_queued(self, command_type: str, seconds: float) -> None:
        self._waits(command_type).observe(seconds)

    def turn_ended(self, turn: TurnRecord, ledger_lines: Sequence[SealedLine]) -> None:
        for line in ledger_lines:
            self._appends(line.ledger_id.rpartition("/")[2]).inc()
        if not turn.final:
            self._escalations(_fault(turn)).inc()
            return
        finished_us = turn.finished_us or time.time_ns() // 1000
        seconds = max(0.0, (finished_us - turn.accepted_us) / 1_000_000)
        self._durations(turn.kind.value, turn.state.value).observe(seconds)
        violations = (turn.result or {}).get("violations")
        if isinstance(violations, list):
            for violation in violations:
                capability = violation.get("capability") if isinstance(violation, dict) else None
                self._violation(str(capability or ""))

    def intake_refused(self, capability: str) -> None:
        self._violation(capability)

    def _violation(self, capability: str) -> None:
        self._violations(capability or "unknown").inc()

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        self.verifications.inc(ledgers)
        self.verify_failures.inc(failures)

    # -- the ledger syncer -----------------------------------------------------------------

    def ledger_synced(self, seconds: float) -> None:
        """One batch of ledger files was made durable in *seconds* (any thread)."""
        self.ledger_sync.observe(seconds)
