"""Limits of each MCP session: turns in flight, output bytes returned, the hunter sessions and
turns it may act on.

An MCP session is a client's connection as the transport knows it: the process for stdio (one
host), an ``Mcp-Session-Id`` over streamable HTTP. A client of the sessionless protocol
(2026-07-28) has no such id: all of its requests share the server's one unnamed bucket (over
HTTP, everyone holding the token).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from supervisor.mcp.config import McpSettings
from supervisor.mcp.errors import BadInput, LimitReached

__all__ = ["Limits", "SessionBucket"]

#: MCP sessions remembered at most; the oldest idle one is forgotten first
_MAX_BUCKETS: Final = 1_024


@dataclass
class SessionBucket:
    """What one MCP session has: its hunter sessions, its turns and what it has spent."""

    key: str
    sessions: set[str] = field(default_factory=set)
    turns: set[int] = field(default_factory=set)
    in_flight: int = 0
    returned_bytes: int = 0

    def owns_session(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise BadInput(
                f"session {session_id!r} was not opened through this MCP session: open one"
                " with open_session and use the session_id it returns"
            )

    def owns_turn(self, turn_id: int) -> None:
        if turn_id not in self.turns:
            raise BadInput(
                f"turn {turn_id} was not started through this MCP session: use a turn_id that"
                " run_command or submit_instruction returned"
            )


class Limits:
    """The buckets of every MCP session of one server, and the server-wide in-flight bound."""

    def __init__(self, settings: McpSettings) -> None:
        self._settings = settings
        self._buckets: OrderedDict[str, SessionBucket] = OrderedDict()
        self.in_flight_total = 0

    def bucket(self, key: str) -> SessionBucket:
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = SessionBucket(key)
            if len(self._buckets) > _MAX_BUCKETS:
                self._forget_one()
        self._buckets.move_to_end(key)
        return found

    def _forget_one(self) -> None:
        for key, bucket in self._buckets.items():
            if bucket.in_flight == 0:
                del self._buckets[key]
                return

    @contextmanager
    def turn_slot(self, bucket: SessionBucket) -> Iterator[None]:
        """Hold one of the session's (and the server's) turns in flight; `LimitReached` when
        none is free (nothing is submitted then)."""
        cap = self._settings.max_turns_in_flight
        if bucket.in_flight >= cap:
            raise LimitReached(
                f"this MCP session already has {bucket.in_flight} turns in flight (the limit is"
                f" {cap}): wait for one to finish (wait_turn) or cancel one (cancel_turn)"
            )
        total = self._settings.max_turns_in_flight_total
        if self.in_flight_total >= total:
            raise LimitReached(
                f"this server already has {self.in_flight_total} turns in flight (the limit is"
                f" {total}): try again when one has finished"
            )
        bucket.in_flight += 1
        self.in_flight_total += 1
        try:
            yield
        finally:
            bucket.in_flight -= 1
            self.in_flight_total -= 1

    def output_allowance(self, bucket: SessionBucket) -> int:
        """Bytes this call may still return: the per-call cap, within what is left of the
        session's budget."""
        left = self._settings.max_session_output_bytes - bucket.returned_bytes
        return max(0, min(self._settings.max_output_bytes, left))

    @staticmethod
    def charge(bucket: SessionBucket, size: int) -> None:
        bucket.returned_bytes += size

    def statistics(self) -> dict[str, int]:
        return {"mcp_sessions": len(self._buckets), "turns_in_flight": self.in_flight_total}
