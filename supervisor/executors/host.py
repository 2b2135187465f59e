"""The seam between a connection and the hub around it: ``ConnectionHost``.

A ``Connection`` reports to its host (the hub) what concerns more than itself: status changes
that watchers wait for, changes of its load or status (the hub's free-slot totals follow them),
slots that queued attempts may take, frame errors and late responses (counted in the hub's
statistics) and quarantines (which outlive the connection; the host logs them). It reads the
limits in force through it too, since a reload may replace them while the connection is open.

The seam is generic in the connection it is told about (`Connection` for the hub), so that this
module and ``connection`` do not import each other.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from supervisor.executors.peercred import PeerCredentials
from supervisor.executors.settings import HubSettings
from supervisor.wire.frames import FrameError

__all__ = ["ConnectionHost"]

#: the connection a host is told about
_Conn_contra = TypeVar("_Conn_contra", contravariant=True)


class ConnectionHost(Protocol[_Conn_contra]):
    """What a connection needs from the hub around it."""

    @property
    def settings(self) -> HubSettings:
        """The limits in force now (they may be replaced while the connection is open)."""

    @property
    def trace(self) -> bool:
        """Whether per-frame debug events are wanted."""

    def changed(self) -> None:
        """An executor's status changed (wakes ``wait_for_executor``)."""

    def slot_freed(self, conn: _Conn_contra) -> None:
        """``conn`` may have a free slot: hand it to a queued attempt."""

    def recount(self, conn: _Conn_contra) -> None:
        """``conn``'s load or status may have changed: update the free-slot totals (O(1))."""

    def frame_error(
        self,
        exc: FrameError,
        *,
        executor_id: str | None,
        in_flight: list[str],
        creds: PeerCredentials | None,
    ) -> None:
        """Count and log a frame that could not be read."""

    def late_response(self) -> None:
        """Count a response that came after its attempt ended."""

    def quarantine(
        self,
        executor_id: str,
        creds: PeerCredentials | None,
        *,
        instruction_id: str,
        detail: str,
    ) -> None:
        """Quarantine ``executor_id`` (and its peer) for ``settings.quarantine_s`` after the
        security violation *detail* in its answer to *instruction_id* (logged
        ``executor_quarantined``); the connection closes next."""
