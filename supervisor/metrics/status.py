"""The systemd status line: live counts for STATUS= (`supervisor.sdnotify.status_loop`)."""

from __future__ import annotations

from supervisor.executors.reports import HubStatistics
from supervisor.turns.core import CoreStatistics

__all__ = ["status_line"]


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
