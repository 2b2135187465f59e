"""The other daemons of a fleet, as their heartbeats say, and this daemon's own heartbeat.

Every third of the lease the fleet (`fleet.Fleet`) writes this daemon's heartbeat (what its
executors serve, the packages installed here, its root) and reads the others': which are alive
(a heartbeat within the lease), which take work (not draining) and what command types their
executors serve. The change feed hears of a daemon that began or stopped heartbeating.

It is apart from the homes and the claims: it only reads and writes heartbeats, and the
hand-over (`handover.HandOver`) and the claim rounds ask it where work can go.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from supervisor.store.fleet import DaemonRecord, FleetStore
from supervisor.turns.context import TurnDeps, now_us

__all__ = ["Peers", "installed_packages"]


def _texts(value: object) -> list[str]:
    """A list of strings from a heartbeat's info (anything else: none)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def installed_packages(root: Path) -> frozenset[str] | None:
    """Packages installed under *root* (`<root>/installed/<id>`); None when it cannot tell."""
    try:
        return frozenset(p.name for p in (root / "installed").iterdir() if p.is_dir())
    except OSError:
        return None


class Peers:
    """This daemon's heartbeat, and the live daemons of the fleet as last seen."""

    def __init__(
        self,
        deps: TurnDeps,
        store: FleetStore,
        *,
        served: Callable[[], frozenset[str]],
        info: Callable[[], Mapping[str, object]],
    ) -> None:
        self._deps = deps
        self._store = store
        #: command types the executors connected here serve now
        self._served = served
        #: what the heartbeat says about this daemon
        self._info = info
        self._started_us = now_us()
        self._host = socket.gethostname()
        #: the other daemons seen alive at the last look (None: not looked yet)
        self._peers: set[str] | None = None
        #: their last heartbeats (what each serves, its packages, whether it drains)
        self._alive: dict[str, DaemonRecord] = {}
        self._peer_serves: frozenset[str] = frozenset()

    def served_by_peers(self) -> frozenset[str]:
        """Command types the executors of the other live daemons serve (their heartbeats, as
        of the last look)."""
        return self._peer_serves

    def peer_only(self) -> frozenset[str]:
        """Command types no executor here serves but another live daemon's does: a turn of
        one waits for its session to be handed over to that daemon (`handover.HandOver`), and
        does not end NO_CAPABLE_EXECUTOR here."""
        return self._peer_serves - self._served()

    def takers(self, commands: frozenset[str], package_id: str) -> list[str]:
        """The live daemons that serve every one of *commands* and have *package_id*
        installed (a daemon that does not say which packages it has counts as having it)."""
        takers = []
        for d in self._serving():
            packages = d.info.get("packages")
            has_package = not isinstance(packages, list) or package_id in packages
            if has_package and commands <= frozenset(_texts(d.info.get("serves"))):
                takers.append(d.owner)
        return sorted(takers)

    def _serving(self) -> list[DaemonRecord]:
        """The live daemons of the fleet that take work (not draining), as last seen."""
        return [d for d in self._alive.values() if d.info.get("draining") is not True]

    async def heartbeat(self) -> None:
        """Write this daemon's heartbeat, with what the others read of it."""
        root = self._deps.settings.root
        packages = installed_packages(root)
        await self._store.heartbeat(
            self._deps.owner,
            host=self._host,
            pid=os.getpid(),
            started_us=self._started_us,
            info={
                **self._info(),
                # what the others read: the command types served here (`served_by_peers`),
                # the packages installed (a hand-over goes only where they are) and the root
                # (`hunter ledger verify --store` tells a daemon's root from an export)
                "serves": sorted(self._served()),
                "packages": None if packages is None else sorted(packages),
                "root": str(root.resolve()),
            },
        )

    async def watch(self) -> None:
        """Note the live daemons of the fleet and what they serve, and tell the change feed
        which began or stopped heartbeating since the last look (the first look only learns
        who is there)."""
        now = now_us()
        lease_us = self._deps.settings.lease_ms * 1000
        seen = {d.owner: d for d in await self._store.daemons() if d.owner != self._deps.owner}
        alive = {owner for owner, d in seen.items() if now - d.heartbeat_us <= lease_us}
        self._alive = {owner: seen[owner] for owner in alive}
        self._peer_serves = frozenset(
            c for d in self._serving() for c in _texts(d.info.get("serves"))
        )
        known, self._peers = self._peers, alive
        feed = self._deps.tracker.feed
        if known is None or feed is None:
            return
        for owner in sorted(alive - known):
            d = seen[owner]
            feed.publish("daemon.joined", daemon=owner, detail=f"{d.host} pid {d.pid}")
        for owner in sorted(known - alive):
            d_or_none = seen.get(owner)
            detail = (
                "left (a clean stop)"
                if d_or_none is None
                else f"no heartbeat for {(now - d_or_none.heartbeat_us) / 1e6:.1f} s"
                f" (its lease is {lease_us / 1e6:g} s): its turns and sessions are taken over"
            )
            feed.publish("daemon.lost", daemon=owner, detail=detail)
