"""The daemon's metrics registry: the event metrics plus the scrape-time statistics collector,
rendered in the Prometheus text format."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from supervisor.metrics.collector import Sources, StatisticsCollector
from supervisor.metrics.events import EventMetrics

__all__ = ["DaemonMetrics"]


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
