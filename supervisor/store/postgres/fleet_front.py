"""The `FleetStore` half of the PostgreSQL engine's facade: session homes, the anchored
ledger lines, the daemons' heartbeats and the resolutions asked of another daemon.

Apart from `engine` because these change with the fleet's rules, never with the turns'; they
reach the database only through the store's three ways in (`Channels`: the committer, the
readers and the renewal connection), so they know nothing of its connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import asyncpg

from ledger.entries import SealedLine
from supervisor.store.fleet import DaemonRecord, LedgerHead, SessionHome
from supervisor.store.postgres import fleet_ops
from supervisor.store.postgres.batches import RowLocks
from supervisor.store.protocol import Resolution, TurnRecord
from supervisor.store.requests import check_lease
from supervisor.store.sealing import sessions_of

__all__ = ["Channels", "PostgresFleet"]

T = TypeVar("T")


class Channels(Protocol):
    """How the fleet's operations reach the database (`channels.StoreChannels`)."""

    def write(
        self, fn: Callable[[asyncpg.Connection], Awaitable[T]], *, locks: RowLocks | None = None
    ) -> Awaitable[T]:
        """Through the committer, in a batch."""
        ...

    def read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> Awaitable[T]:
        """In a read-only snapshot."""
        ...

    def renew(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> Awaitable[T]:
        """On the renewal connection, never behind a batch."""
        ...

    def learn(self, lease_ms: int) -> None:
        """The lease the daemon claims and renews with (the connections' timeouts)."""
        ...


class PostgresFleet:
    """`FleetStore` over the store's *channels*."""

    def __init__(self, channels: Channels) -> None:
        self._channels = channels

    async def home_session(self, session_id: str, owner: str, *, lease_ms: int) -> SessionHome:
        check_lease(lease_ms)
        return await self._channels.write(
            lambda c: fleet_ops.home_session(c, session_id, owner, lease_ms),
            locks=RowLocks(sessions=(session_id,)),
        )

    async def claim_homes(
        self,
        owner: str,
        *,
        lease_ms: int,
        limit: int,
        packages: frozenset[str] | None,
        serves: frozenset[str] | None = None,
    ) -> list[SessionHome]:
        check_lease(lease_ms)
        self._channels.learn(lease_ms)  # every claim round of a fleet's daemon
        return await self._channels.write(
            lambda c: fleet_ops.claim_homes(c, owner, lease_ms, limit, packages, serves=serves)
        )

    async def renew_homes(
        self, homes: Sequence[SessionHome], *, lease_ms: int
    ) -> list[SessionHome]:
        held = tuple(homes)
        if not held:
            return []
        self._channels.learn(lease_ms)
        return await self._channels.renew(lambda c: fleet_ops.renew_homes(c, held, lease_ms))

    async def release_home(self, home: SessionHome, *, reserve_ms: int | None = None) -> None:
        if reserve_ms is not None:
            check_lease(reserve_ms)
        await self._channels.write(
            lambda c: fleet_ops.release_home(c, home, reserve_ms),
            locks=RowLocks(sessions=(home.session_id,)),
        )

    async def session_homes(self, session_ids: Sequence[str] | None = None) -> dict[str, str]:
        ids = None if session_ids is None else tuple(session_ids)
        return await self._channels.read(lambda c: fleet_ops.session_homes(c, ids))

    async def waiting_turns(self, owner: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        ids = tuple(session_ids)
        if not ids:
            return []
        return await self._channels.read(lambda c: fleet_ops.waiting_turns(c, owner, ids))

    async def anchor_ledger_lines(self, owner: str, lines: Sequence[SealedLine]) -> None:
        kept = tuple(lines)
        if kept:
            await self._channels.write(
                lambda c: fleet_ops.anchor_ledger_lines(c, owner, kept),
                locks=RowLocks(sessions=tuple(sessions_of(x.ledger_id for x in kept))),
            )

    async def ledger_heads(self, ledger_ids: Sequence[str] | None = None) -> list[LedgerHead]:
        ids = None if ledger_ids is None else tuple(ledger_ids)
        return await self._channels.read(lambda c: fleet_ops.ledger_heads(c, ids))

    async def heartbeat(
        self, owner: str, *, host: str, pid: int, started_us: int, info: Mapping[str, object]
    ) -> None:
        await self._channels.renew(
            lambda c: fleet_ops.heartbeat(
                c, owner, host=host, pid=pid, started_us=started_us, info=info
            )
        )

    async def daemons(self) -> list[DaemonRecord]:
        return await self._channels.read(fleet_ops.daemons)

    async def forget_daemon(self, owner: str) -> None:
        await self._channels.write(lambda c: fleet_ops.forget_daemon(c, owner))

    async def request_resolution(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        decided_by: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        return await self._channels.write(
            lambda c: fleet_ops.request_resolution(c, turn_id, resolution, decided_by),
            locks=RowLocks(turns=(turn_id,)),
        )

    async def pending_resolutions(
        self, session_ids: Sequence[str]
    ) -> list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]]:
        ids = tuple(session_ids)
        if not ids:
            return []
        return await self._channels.read(lambda c: fleet_ops.pending_resolutions(c, ids))
