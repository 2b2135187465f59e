"""The metrics read at scrape time from the daemon's own statistics snapshots.

Gauges (turns active and queued, executors by status, queue depth per command type) and the
counters the daemon already keeps (store commits, executor frame errors, syncer failures) are
not mirrored into prometheus-client objects: `StatisticsCollector.collect` asks each part of the
daemon for its `statistics()` when Prometheus scrapes, on the event loop, so a scrape sees one
consistent moment and costs nothing between scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ledger.syncer import SyncerStatistics
from sandbox.policy.breaker import CircuitState
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from supervisor.executors.reports import HubStatistics
from supervisor.store.protocol import StoreStatistics
from supervisor.turns.core import CoreStatistics

__all__ = ["Sources", "StatisticsCollector"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sources:
    """Where a scrape reads the daemon's statistics (each a cheap, synchronous snapshot)."""

    core: Callable[[], CoreStatistics]
    hub: Callable[[], HubStatistics]
    store: Callable[[], StoreStatistics]
    syncer: Callable[[], SyncerStatistics] | None = None


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class StatisticsCollector(Collector):
    """A prometheus-client collector over `Sources` (registered in the daemon's registry)."""

    def __init__(self, sources: Sources, *, clock: Callable[[], float] = time.time) -> None:
        self._sources = sources
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        yield from self._turns(self._sources.core())
        yield from self._executors(self._sources.hub(), self._sources.core())
        yield from self._store(self._sources.store())
        if self._sources.syncer is not None:
            syncer = self._sources.syncer()
            yield _counter(
                "hunter_ledger_sync_failures",
                "Ledger files whose sync failed (each such ledger refuses further appends).",
                syncer.failures,
            )

    def _turns(self, core: CoreStatistics) -> Iterator[Metric]:
        turns = core.turns
        yield _gauge("hunter_sessions_open", "Sessions open in this daemon.", core.sessions_open)
        yield _gauge("hunter_draining", "1 while the daemon drains, else 0.", int(core.draining))
        yield _gauge("hunter_turns_active", "Turns this daemon is running.", turns.turns_active)
        yield _gauge(
            "hunter_turns_queued",
            "Intake depth: accepted turns whose first attempt has not started yet.",
            turns.turns_queued,
        )
        oldest = turns.oldest_queued_us
        age = 0.0 if oldest is None else max(0.0, self._clock() - oldest / 1_000_000)
        yield _gauge(
            "hunter_turns_oldest_queued_age_seconds",
            "Age of the oldest queued turn (0 when none is queued).",
            age,
        )
        yield _gauge(
            "hunter_turns_waiting_retry",
            "Turns sleeping through a backoff before their next attempt.",
            turns.turns_waiting_retry,
        )
        yield _gauge("hunter_attempts_running", "Attempts running now.", turns.attempts_running)
        yield _gauge(
            "hunter_process_turns_running",
            "Process turns running in the sandbox now.",
            turns.process_turns_running,
        )
        yield _counter(
            "hunter_turns_accepted", "Turns durably accepted by this daemon.", turns.accepted_total
        )

    def _executors(self, hub: HubStatistics, core: CoreStatistics) -> Iterator[Metric]:
        by_status = GaugeMetricFamily(
            "hunter_executors",
            "Executors by status (READY, BUSY, ERROR; OFFLINE: recently disconnected).",
            labels=("status",),
        )
        for status in ExecutorStatus:
            by_status.add_metric((status.value,), hub.executors_by_status.get(status.value, 0))
        yield by_status
        yield _gauge("hunter_executors_connected", "Executors connected.", hub.executors_connected)
        yield _gauge(
            "hunter_executors_quarantined",
            "Executor ids refused for a while after a security violation.",
            hub.quarantined,
        )
        depth = GaugeMetricFamily(
            "hunter_queue_depth",
            "Instructions waiting for an executor slot, by command type (turns parked in the "
            "turn core plus attempts waiting in the hub's queue).",
            labels=("command_type",),
        )
        for command in ExecutorCommandType:
            name = command.value
            waiting = core.parked_by_command.get(name, 0) + hub.queued_by_command.get(name, 0)
            depth.add_metric((name,), waiting)
        yield depth
        circuit = GaugeMetricFamily(
            "hunter_circuit_state",
            "Circuit breaker per executor pool: 0 closed, 1 half-open, 2 open.",
            labels=("command_type",),
        )
        for command in ExecutorCommandType:
            state = hub.circuits.get(command.value, {}).get("state", "closed")
            circuit.add_metric((command.value,), CircuitState(state).gauge)
        yield circuit
        yield _gauge(
            "hunter_executor_instructions_in_flight",
            "Instructions sent to executors and not yet answered.",
            hub.in_flight,
        )
        yield _counter(
            "hunter_executor_connections_rejected",
            "Executor connections refused (uid, hello, quarantine, duplicate id).",
            hub.connections_rejected,
        )
        yield _counter(
            "hunter_executor_frame_errors",
            "Oversized or undecodable frames received from executors.",
            hub.frame_errors,
        )
        yield _counter(
            "hunter_executor_late_responses",
            "Executor responses that arrived after their attempt had ended.",
            hub.late_responses,
        )

    def _store(self, store: StoreStatistics) -> Iterator[Metric]:
        for name, doc, value in (
            ("hunter_store_commits", "Transactions committed by the turn store.", store.commits),
            (
                "hunter_store_operations",
                "Operations (accepts, starts, endings...) carried by those commits.",
                store.operations,
            ),
            (
                "hunter_store_stale_writes_refused",
                "Writes refused because their claim's fencing token was stale.",
                store.stale_writes_refused,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=("engine",))
            family.add_metric((store.engine,), value)
            yield family
