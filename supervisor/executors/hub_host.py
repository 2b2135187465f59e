"""The hub as its connections see it: ``HubHost``, the hub's ``host.ConnectionHost``.

A connection reports to its host what concerns more than itself; ``HubHost`` sends each report
where it belongs: status changes to the roster's change signal, load changes and freed slots to
the dispatcher (bound once: they come on every response), frame errors and late responses to
the hub's counters, quarantines to the quarantine list (logged, and published on the feed). It
also holds the limits in force, which a reload replaces.

It is apart from ``hub`` because it is the hub's side of one seam (``host``), changed when that
seam changes, and because the hub's front and its connection lifecycle both hand it on.
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor.executors.connection import Connection
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials
from supervisor.executors.quarantine import Quarantine
from supervisor.executors.roster import Roster
from supervisor.executors.settings import HubSettings
from supervisor.feed import Feed
from supervisor.wire.frames import FrameError

__all__ = ["HubHost"]


class HubHost:
    """The hub as its connections see it (``host.ConnectionHost``): the limits in force, and
    where their reports go (roster, dispatcher, quarantine, the hub's frame/late counters)."""

    __slots__ = (
        "_log",
        "_quarantine",
        "changed",
        "feed",
        "frame_errors",
        "late_responses",
        "recount",
        "settings",
        "slot_freed",
        "trace",
    )

    def __init__(
        self,
        *,
        settings: HubSettings,
        roster: Roster,
        dispatcher: Dispatcher,
        quarantine: Quarantine,
        log: EventLog,
        feed: Feed | None = None,
    ) -> None:
        self.settings = settings
        self.trace = False
        self.feed = feed
        self._quarantine = quarantine
        self._log = log
        self.frame_errors = 0
        self.late_responses = 0
        # Bound once: these are called on every response (no extra hop on the hot path).
        self.changed: Callable[[], None] = roster.notify
        self.slot_freed: Callable[[Connection], None] = dispatcher.slot_freed
        self.recount: Callable[[Connection], None] = dispatcher.recount

    def frame_error(
        self,
        exc: FrameError,
        *,
        executor_id: str | None,
        in_flight: list[str],
        creds: PeerCredentials | None,
    ) -> None:
        self.frame_errors += 1
        self._log.warning(
            "frame_error",
            executor_id=executor_id,
            error=type(exc).__name__,
            reason=exc.reason,
            in_flight=in_flight,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
        )

    def late_response(self) -> None:
        self.late_responses += 1

    def quarantine(
        self,
        executor_id: str,
        creds: PeerCredentials | None,
        *,
        instruction_id: str,
        detail: str,
    ) -> None:
        quarantine_s = self.settings.quarantine_s
        self._quarantine.impose(executor_id, creds, quarantine_s)
        if self.feed is not None:
            self.feed.publish(
                "executor.quarantined",
                executor_id=executor_id,
                detail=f"refused for {quarantine_s:g} s",
            )
        self._log.warning(
            "executor_quarantined",
            executor_id=executor_id,
            instruction_id=instruction_id,
            quarantine_s=quarantine_s,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
            detail=detail,
        )
