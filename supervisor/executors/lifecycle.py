"""Each executor connection's life in the hub: ``ConnectionLifecycle``.

It accepts the connections of ``executors.sock`` (one task each), has ``reception`` greet them,
refuses a valid ``hello`` the registry forbids (a quarantined executor, a duplicate id), and
otherwise builds the ``Connection``, sends the ``welcome``, registers it (roster, dispatcher,
feed), serves it until it ends and unregisters it, keeping its OFFLINE snapshot. It is each
connection's error boundary: whatever happens on one costs that connection only. Closing
disconnects every connection and waits until their tasks have ended.

It is apart from ``hub`` because connections come and go for reasons of their own (the door's
rules, registration, the feed's events), while the hub's front runs attempts; the two share
only the registry (roster, dispatcher, quarantine) and the host handed to each connection.
"""

from __future__ import annotations

import os

import anyio
import anyio.abc

from supervisor.executors.clock import ms, now_us
from supervisor.executors.connection import Connection
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.hub_host import HubHost
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials, stream_peer_credentials
from supervisor.executors.quarantine import Quarantine
from supervisor.executors.reception import Reception
from supervisor.executors.reports import ExecutorInfo, HubReason
from supervisor.executors.roster import Roster
from supervisor.executors.settings import HubSettings
from supervisor.logging import describe_error
from supervisor.wire.executor import Reject, RejectReason

__all__ = ["ConnectionLifecycle"]


class ConnectionLifecycle:
    """Accepts, greets, refuses or registers, serves and unregisters executor connections."""

    __slots__ = (
        "_dispatcher",
        "_host",
        "_log",
        "_quarantine",
        "_reception",
        "_roster",
        "_serve_scope",
        "_served",
        "allowed_uids",
        "closing",
    )

    def __init__(
        self,
        *,
        roster: Roster,
        dispatcher: Dispatcher,
        quarantine: Quarantine,
        host: HubHost,
        log: EventLog,
    ) -> None:
        self._roster = roster
        self._dispatcher = dispatcher
        self._quarantine = quarantine
        self._host = host
        self._log = log
        self._reception = Reception(host=host, log=log)
        #: the uids that may connect (see `configure`)
        self.allowed_uids: frozenset[int] = frozenset()
        #: set by `close`: every newcomer is refused
        self.closing = False
        self._serve_scope: anyio.CancelScope | None = None
        #: set once `serve` has returned (every connection's task ended), while it runs
        self._served: anyio.Event | None = None

    def configure(self, settings: HubSettings) -> None:
        """Apply *settings* (a reload) to the connections that come next."""
        self.allowed_uids = (
            settings.allowed_uids
            if settings.allowed_uids is not None
            else frozenset({os.getuid(), 0})
        )

    @property
    def rejected(self) -> int:
        """Connections refused so far."""
        return self._reception.rejected

    async def serve(
        self,
        listener: anyio.abc.Listener[anyio.abc.SocketStream],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept executor connections until `stopped` (or cancellation); one task each."""
        self._served = served = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._serve_scope = tg.cancel_scope
                task_status.started()
                await listener.serve(self._handle_connection, task_group=tg)
        finally:
            served.set()

    def close(self) -> None:
        """Refuse newcomers and close every connection (in-flight attempts end CRASH)."""
        self.closing = True
        for conn in self._roster.connected():
            conn.disconnect(HubReason.HUB_CLOSED, "the hub is shutting down")

    async def stopped(self) -> None:
        """Stop accepting; when `serve` runs, return once it has (every connection's task
        ended, each disconnect logged)."""
        if self._serve_scope is not None:
            self._serve_scope.cancel()
        if self._served is not None:
            await self._served.wait()
        else:
            await anyio.lowlevel.checkpoint()

    def info(self, conn: Connection, *, detail: str = "") -> ExecutorInfo:
        """The snapshot of *conn*, with its quarantine if any."""
        return conn.info(
            quarantined_until_us=self._quarantine.until_us(conn.executor_id), detail=detail
        )

    async def _handle_connection(self, stream: anyio.abc.SocketStream) -> None:
        """One executor connection, and its error boundary: whatever happens on it costs this
        connection only (closed, logged with the peer's uid and pid), never the hub."""
        creds: PeerCredentials | None = None
        try:
            async with stream:
                creds = stream_peer_credentials(stream)
                await self._connection(stream, creds)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._log.info(
                "connection_lost",
                detail=repr(exc),
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
            )
        except Exception as exc:  # one broken connection must never take the hub down
            self._log.exception(
                "connection_failed",
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
                error=describe_error(exc),
            )

    async def _connection(
        self, stream: anyio.abc.SocketStream, creds: PeerCredentials | None
    ) -> None:
        reception = self._reception
        greeted = await reception.greet(
            stream, creds, allowed_uids=self.allowed_uids, closing=self.closing
        )
        if greeted is None:
            return
        hello, reader = greeted
        refusal = self._refusal(hello.executor_id, creds)
        if refusal is not None:
            await reception.reject(stream, refusal, executor_id=hello.executor_id, creds=creds)
            return
        conn = Connection(
            executor_id=hello.executor_id,
            commands=hello.commands,
            slots=hello.slots,
            software=hello.software,
            creds=creds,
            stream=stream,
            host=self._host,
            log=self._log,
        )
        await reception.welcome(stream, hello.executor_id)
        self._register(conn)
        try:
            await conn.serve(reader)
        finally:
            self._unregister(conn)

    def _refusal(self, executor_id: str, creds: PeerCredentials | None) -> Reject | None:
        """The reject of a valid hello from ``executor_id``: quarantined or a duplicate id."""
        remaining = self._quarantine.remaining_s(executor_id, creds)
        if remaining > 0:
            return Reject(
                RejectReason.QUARANTINED,
                f"executor {executor_id} is quarantined for a security violation",
                ms(remaining),
            )
        if executor_id in self._roster:
            settings = self._host.settings
            return Reject(
                RejectReason.DUPLICATE_EXECUTOR_ID,
                f"an executor with id {executor_id} is already connected",
                ms(settings.heartbeat_interval_s * settings.heartbeat_misses),
            )
        return None

    def _register(self, conn: Connection) -> None:
        self._roster.add(conn)
        self._dispatcher.add(conn)
        creds = conn.creds
        self._log.info(
            "executor_connected",
            executor_id=conn.executor_id,
            commands=[c.value for c in conn.commands],
            slots=conn.slots,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
            software=conn.software,
        )
        self._roster.notify()
        self._dispatcher.slot_freed(conn)
        if (feed := self._host.feed) is not None:
            feed.publish(
                "executor.connected",
                executor_id=conn.executor_id,
                command_types=tuple(c.value for c in conn.commands),
            )

    def _unregister(self, conn: Connection) -> None:
        reason, detail = conn.close_reason, conn.close_detail
        self._dispatcher.remove(conn)
        self._roster.remove(conn, self.info(conn, detail=detail))
        self._log.info(
            "executor_disconnected",
            executor_id=conn.executor_id,
            reason_code=reason,
            detail=detail,
            connected_ms=(now_us() - conn.connected_at_us) // 1000,
        )
        self._roster.notify()
        if (feed := self._host.feed) is not None:
            feed.publish(
                "executor.gone",
                executor_id=conn.executor_id,
                command_types=tuple(c.value for c in conn.commands),
                reason_code=reason,
                detail=detail or None,
            )
