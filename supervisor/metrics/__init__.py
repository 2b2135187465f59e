"""Prometheus metrics of the daemon (docs/metrics.md lists every one).

One `DaemonMetrics` per daemon owns a private `CollectorRegistry` (never prometheus-client's
global one): event counters and histograms fed by the turn core's `TurnEvents` and the ledger
syncer (`events`), plus a collector that reads the daemon's statistics snapshots at scrape time
(`collector`). The daemon serves `render()` over HTTP on its own task group (`http`) and/or
writes it as a node-exporter textfile (`textfile`); `status_line` is the systemd STATUS= text.

May import `supervisor.turns`, `supervisor.executors`, `supervisor.store`, `ledger`, `sandbox`;
nothing imports this package but `supervisor.server`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from supervisor.executors.reports import HubStatistics
from supervisor.metrics.collector import Sources, StatisticsCollector
from supervisor.metrics.events import EventMetrics
from supervisor.metrics.http import CONTENT_TYPE, TcpAddress, parse_listen, serve_metrics
from supervisor.metrics.textfile import write_textfile, write_textfiles
from supervisor.turns.core import CoreStatistics

__all__ = [
    "CONTENT_TYPE",
    "DaemonMetrics",
    "EventMetrics",
    "Sources",
    "StatisticsCollector",
    "TcpAddress",
    "parse_listen",
    "serve_metrics",
    "status_line",
    "write_textfile",
    "write_textfiles",
]


class _WithoutCreated:
    """The registry's families without their ``_created`` samples: a creation time per counter
    and histogram series doubles what Prometheus stores and tells an operator nothing here
    (prometheus-client's switch for it is process-global; this filter is not)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():  # fresh objects at each collect
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class DaemonMetrics(EventMetrics):
    """The daemon's registry: the event metrics, and the statistics collector once `watch`ed."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        super().__init__(self.registry)
        self._collector: StatisticsCollector | None = None
        self._exposed = _WithoutCreated(self.registry)

    def watch(self, sources: Sources) -> None:
        """Read *sources* at every scrape (called once the daemon's parts exist)."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = StatisticsCollector(sources)
        self.registry.register(self._collector)

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4), on the event loop."""
        return generate_latest(self._exposed)


def status_line(core: CoreStatistics, hub: HubStatistics) -> str:
    """The live counts for systemd's STATUS= (what `systemctl status hunter` shows)."""
    turns = core.turns
    ready = hub.executors_by_status.get("READY", 0)
    busy = hub.executors_by_status.get("BUSY", 0)
    text = (
        f"{turns.turns_active} turns active, {turns.turns_queued} queued, "
        f"{turns.attempts_running} attempts running; "
        f"{ready} executors ready, {busy} busy"
    )
    return f"draining: {text}" if core.draining else text
