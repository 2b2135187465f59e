"""Prometheus metrics of the daemon (docs/metrics.md lists every one).

One `DaemonMetrics` per daemon owns a private `CollectorRegistry` (never prometheus-client's
global one): event counters and histograms fed by the turn core's `TurnEvents` and the ledger
syncer (`events`), plus a collector that reads the daemon's statistics snapshots at scrape time
(`collector`), in `registry`. The daemon serves `render()` over HTTP on its own task group
(`http`) and/or writes it as a node-exporter textfile (`textfile`); `status_line` is the
systemd STATUS= text.

May import `supervisor.turns`, `supervisor.executors`, `supervisor.store`, `ledger`, `sandbox`;
nothing imports this package but the daemon (`supervisor.server`, `supervisor.daemon.listeners`).
"""

from __future__ import annotations

from supervisor.metrics.collector import Sources, StatisticsCollector
from supervisor.metrics.events import EventMetrics
from supervisor.metrics.http import CONTENT_TYPE, TcpAddress, parse_listen, serve_metrics
from supervisor.metrics.registry import DaemonMetrics
from supervisor.metrics.status import status_line
from supervisor.metrics.textfile import write_textfile, write_textfiles

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
