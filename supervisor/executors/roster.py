"""The roster: which executors the hub knows, and a signal for whoever waits on a change.

Connected executors are listed by id; when one disconnects, a snapshot of it (OFFLINE) is kept
among the last ``MAX_OFFLINE_RECORDS`` for ``hunter executors`` and ``wait_for_executor``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Final

import anyio

from supervisor.executors.connection import Connection
from supervisor.executors.reports import ExecutorInfo

__all__ = ["MAX_OFFLINE_RECORDS", "Roster"]

MAX_OFFLINE_RECORDS: Final = 4096


class Roster:
    """Connected executors by id, recent OFFLINE snapshots, and the change signal."""

    __slots__ = ("_changed", "_connected", "_offline")

    def __init__(self) -> None:
        self._connected: dict[str, Connection] = {}
        self._offline: collections.OrderedDict[str, ExecutorInfo] = collections.OrderedDict()
        self._changed = anyio.Event()

    def __len__(self) -> int:
        return len(self._connected)

    def __contains__(self, executor_id: str) -> bool:
        return executor_id in self._connected

    def get(self, executor_id: str) -> Connection | None:
        """The connected executor ``executor_id``, or ``None``."""
        return self._connected.get(executor_id)

    def connected(self) -> list[Connection]:
        """The connected executors, in the order they connected."""
        return list(self._connected.values())

    def offline(self, executor_id: str) -> ExecutorInfo | None:
        """The snapshot of ``executor_id`` taken when it disconnected, or ``None``."""
        return self._offline.get(executor_id)

    def offline_records(self) -> Iterable[ExecutorInfo]:
        """Snapshots of recently disconnected executors, oldest first."""
        return self._offline.values()

    def offline_count(self) -> int:
        return len(self._offline)

    def add(self, conn: Connection) -> None:
        """List ``conn`` as connected (its OFFLINE snapshot, if any, is dropped)."""
        self._connected[conn.executor_id] = conn
        self._offline.pop(conn.executor_id, None)

    def remove(self, conn: Connection, snapshot: ExecutorInfo) -> None:
        """Unlist ``conn`` and keep ``snapshot`` as its OFFLINE record."""
        if self._connected.get(conn.executor_id) is conn:
            del self._connected[conn.executor_id]
        self._offline[conn.executor_id] = snapshot
        while len(self._offline) > MAX_OFFLINE_RECORDS:
            self._offline.popitem(last=False)

    def notify(self) -> None:
        """Wake everyone waiting in ``wait_changed`` (an executor came, went or changed)."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_changed(self) -> None:
        """Wait until the next ``notify``."""
        await self._changed.wait()
