"""The `Client`'s connection to the daemon: one `ControlClient` held open in a task of its own,
replaced when it drops, and the requests sent over it. Apart from `supervisor.client.client`
(the typed operations) because it changes with the transport and the reconnect policy, not with
the protocol's operations.

When the connection drops (the daemon restarted, or was upgraded), a request that is safe to
repeat reconnects (every 0.2 s, for up to ``reconnect_s``) and is sent again: reads, waits, and
submissions that carry an idempotency key (`Client` gives each one of its own by default).
Others raise `ConnectionLost` and leave the decision to the caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

from supervisor.client.errors import error_for
from supervisor.control.client import ControlClient
from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning

__all__ = ["REPEATABLE", "ClientConnection"]

#: Operations a dropped connection may send again after reconnecting (they change nothing, or
#: carry an idempotency key: ``turn.submit`` always does from the `Client`).
REPEATABLE: Final = frozenset(
    {
        "ping",
        "session.list",
        "session.get",
        "turn.submit",
        "turn.get",
        "turn.evidence",
        "turn.wait",
        "turns.list",
        "status",
        "executors.list",
        "escalations.list",
        "ledger.verify",
    }
)


class ClientConnection:
    """One connection to the control socket at *socket*, reconnecting when it drops (for up to
    *reconnect_s*; 0: never). `open` and `close` bracket its use."""

    def __init__(self, socket: Path, *, reconnect_s: float) -> None:
        self.socket = socket
        self.reconnect_s = reconnect_s
        self._conn: ControlClient | None = None
        self._release: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._generation = 0

    @property
    def current(self) -> ControlClient:
        """The connection now (`ConnectionLost` when not open)."""
        conn = self._conn
        if conn is None:
            raise ConnectionLost(f"the client of {self.socket} is not open (use `async with`)")
        return conn

    async def open(self) -> None:
        """Connect (`DaemonNotRunning`: no daemon there)."""
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            self._conn = await tg.start(self._hold)
        except BaseException as exc:
            # An error of the connection (DaemonNotRunning: no daemon there) is raised as it
            # is, not inside an exception group of the task group; a cancellation is handed
            # to the task group as usual.
            if isinstance(exc, Exception):
                await tg.__aexit__(None, None, None)
            else:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._tg = tg

    async def close(self) -> None:
        """Close the connection (and stop reconnecting)."""
        tg, self._tg, self._conn = self._tg, None, None
        if self._release is not None:
            self._release.set()
        if tg is not None:
            await tg.__aexit__(None, None, None)

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[ControlClient]) -> None:
        """Hold one connection open in a task of the client's own (so that a new one can
        replace it from any task) until released."""
        release = anyio.Event()
        async with ControlClient(self.socket) as conn:
            self._release = release
            task_status.started(conn)
            await release.wait()

    async def _reconnect(self, seen: int) -> ControlClient:
        """A fresh connection after *seen* (the generation that failed): one task reconnects,
        the others wait for it; raises the last error after ``reconnect_s``."""
        async with self._lock:
            if self._generation != seen and self._conn is not None:
                return self._conn
            tg = self._tg
            if tg is None:
                raise ConnectionLost(f"the client of {self.socket} is closed")
            if self._release is not None:
                self._release.set()
            self._conn = None
            last: Exception | None = None
            with anyio.move_on_after(self.reconnect_s):
                while True:
                    try:
                        conn: ControlClient = await tg.start(self._hold)
                    except DaemonNotRunning as exc:
                        last = exc
                        await anyio.sleep(0.2)
                        continue
                    self._conn = conn
                    self._generation += 1
                    return conn
            raise last or ConnectionLost(f"no daemon at {self.socket} for {self.reconnect_s} s")

    async def reconnect_if_lost(self) -> None:
        """Open a new connection if this one dropped (waiting up to ``reconnect_s``)."""
        conn = self._conn
        if conn is None or conn.closed:
            await self._reconnect(self._generation)

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        """One request; its result, or the typed exception of its error. Reconnects and sends
        again when the connection drops and *op* is safe to repeat."""
        while True:
            conn, generation = self._conn, self._generation
            if conn is None:
                msg = f"the client of {self.socket} is not open (use `async with`)"
                raise ConnectionLost(msg)
            try:
                return await conn.call(op, **params)
            except ControlClientError as exc:
                raise error_for(exc) from None
            except ConnectionLost:
                unkeyed = op == "turn.submit" and not params.get("idempotency_key")
                if op not in REPEATABLE or unkeyed or self.reconnect_s <= 0:
                    raise
                await self._reconnect(generation)
