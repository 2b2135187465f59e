"""Handing a session over to a daemon whose executors serve what its turns wait for.

The heartbeats say which command types each daemon's executors serve (`peers.Peers`). A turn
of a command type no executor here serves, while another live daemon's do, is not claimed here
(nor ended NO_CAPABLE_EXECUTOR if it was parked here): once nothing of its session runs here,
the session's home is released with a reservation of one lease for a daemon serving the
command types of its waiting turns, which takes it over like a lapsed home and runs them. A turn
no live daemon serves is claimed, and ends NO_CAPABLE_EXECUTOR when its wait for an executor
runs out, as on a daemon alone.

It is apart from the homes (`homes.Homes`) and the peers: it decides, each heartbeat round,
which session goes where, and only asks them which homes are held and who can take one.
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor.logging import get_logger
from supervisor.store.fleet import FleetStore, SessionHome
from supervisor.store.protocol import Claim
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import TurnDeps
from supervisor.turns.homes import Homes
from supervisor.turns.peers import Peers

__all__ = ["HandOver"]


class HandOver:
    """Hands the sessions homed here over to a daemon that can run their waiting turns."""

    def __init__(
        self,
        deps: TurnDeps,
        store: FleetStore,
        anchors: LedgerAnchors,
        homes: Homes,
        peers: Peers,
        *,
        served: Callable[[], frozenset[str]],
        unpark: Callable[[int], bool],
        parked: Callable[[int], bool],
    ) -> None:
        self._deps = deps
        self._store = store
        self._anchors = anchors
        self._homes = homes
        self._peers = peers
        #: command types the executors connected here serve now
        self._served = served
        #: take a parked turn off its queue (True when it was parked)
        self._unpark = unpark
        #: whether a turn is parked (waits for an executor slot without a task)
        self._parked = parked
        self._log = get_logger("supervisor.turns.fleet")

    async def round(self) -> None:
        """Hand the sessions homed here over to a daemon that can run their waiting turns:
        those with an instruction turn of a command type no executor here serves while the
        executors of another live daemon (with the session's package installed) do. A session
        is handed over only while nothing of it runs here (its turns here, if any, are parked)
        and only to a daemon that serves every command type of its waiting turns."""
        deps = self._deps
        homes = self._homes
        if deps.draining or not homes:
            return
        wanted = self._peers.peer_only()
        if not wanted:
            return
        waiting: dict[str, set[str]] = {}
        for sid, command in await self._store.waiting_turns(deps.owner, sorted(homes.ids())):
            waiting.setdefault(sid, set()).add(command)
        for sid, commands in waiting.items():
            home = homes.get(sid)
            if home is None or not commands & wanted or not self._idle(sid):
                continue
            takers = self._peers.takers(frozenset(commands), home.session.package_id)
            if takers:
                await self._hand(home, frozenset(commands), takers)

    def _idle(self, session_id: str) -> bool:
        """Nothing of the session runs here: its turns here, if any, are parked."""
        tracker = self._deps.tracker
        return not self._deps.sessions.lock(session_id).locked() and all(
            self._parked(turn_id) for turn_id in tracker.in_session(session_id)
        )

    async def _hand(self, home: SessionHome, commands: frozenset[str], takers: list[str]) -> None:
        """Give the session's parked turns back, release its home with a reservation of one
        lease for a daemon that serves *commands* (`FleetStore.claim_homes`), and close it
        here. Its files stay: they hold what the store holds, and a later adoption here goes
        on from them."""
        deps = self._deps
        sid = home.session_id
        session = deps.sessions.get(sid)
        if session is not None:
            await self._anchors.anchor(session)  # every line the files hold is in the store
        if self._homes.get(sid) is not home or not self._idle(sid):
            return  # changed meanwhile: the next round looks again
        tracker = deps.tracker
        given_back: list[Claim] = []
        for turn_id in tracker.in_session(sid):
            active = tracker.get(turn_id)
            if active is None or not self._unpark(turn_id):
                continue
            if active.claim is not None:
                given_back.append(active.claim)
                active.claim = None
            tracker.remove(active)
        self._homes.give_up(sid)  # no claim of this round or the next takes its turns here
        try:
            for claim in given_back:
                await deps.store.release(claim)
            await self._store.release_home(home, reserve_ms=deps.settings.lease_ms)
        except Exception as exc:  # the store is down: still its home; the next round retries
            self._homes.keep(home)
            self._log.error("session_hand_over_failed", session_id=sid, error=str(exc))
            return
        if session is not None:
            self._anchors.forget(session)
            async with deps.sessions.lock(sid):
                await deps.sessions.close(sid)
        self._log.info(
            "session_handed_over",
            session_id=sid,
            command_types=sorted(commands),
            takers=takers,
            turns_given_back=len(given_back),
            reason="no executor here serves "
            + ", ".join(sorted(commands - self._served()))
            + "; the executors of another daemon do",
        )
