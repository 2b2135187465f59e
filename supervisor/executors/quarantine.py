"""Quarantine: executors (by id and by peer uid/pid) refused for a while after a breach.

An answer that breaches security (an authority claim) quarantines its executor for
``quarantine_s``: its id, and the process it connected from, are refused at ``hello`` until then.
Deadlines are monotonic; expired entries are pruned whenever a new one is added.
"""

from __future__ import annotations

import time

from supervisor.executors.clock import now_us
from supervisor.executors.peercred import PeerCredentials

__all__ = ["Quarantine"]


class Quarantine:
    """Quarantine deadlines by executor id and by peer (uid, pid), plus how many were imposed."""

    __slots__ = ("_by_id", "_by_peer", "imposed")

    def __init__(self) -> None:
        self._by_id: dict[str, float] = {}  # executor id -> monotonic deadline
        self._by_peer: dict[tuple[int, int], float] = {}  # (uid, pid) -> deadline
        self.imposed = 0

    def impose(self, executor_id: str, creds: PeerCredentials | None, duration_s: float) -> None:
        """Quarantine ``executor_id`` (and its peer, when known) for ``duration_s``."""
        now = time.monotonic()
        self._by_id = {k: t for k, t in self._by_id.items() if t > now}
        self._by_peer = {k: t for k, t in self._by_peer.items() if t > now}
        until = now + duration_s
        self._by_id[executor_id] = until
        if creds is not None:
            self._by_peer[(creds.uid, creds.pid)] = until
        self.imposed += 1

    def remaining_s(self, executor_id: str, creds: PeerCredentials | None) -> float:
        """Seconds until a connection as ``executor_id`` from ``creds`` is let in (<= 0: now)."""
        until = self._by_id.get(executor_id, 0.0)
        if creds is not None:
            until = max(until, self._by_peer.get((creds.uid, creds.pid), 0.0))
        return until - time.monotonic()

    def until_us(self, executor_id: str) -> int | None:
        """Wall-clock end (µs) of ``executor_id``'s quarantine, ``None`` if not quarantined."""
        until = self._by_id.get(executor_id)
        now = time.monotonic()
        if until is None or until <= now:
            return None
        return now_us() + round((until - now) * 1e6)

    def active(self) -> int:
        """How many executor ids are quarantined now."""
        now = time.monotonic()
        return sum(1 for until in self._by_id.values() if until > now)
