"""The sessions homed on this daemon of a fleet, and what their home leases hold.

Only a session's home appends to its ledgers and runs its turns (`supervisor.store.fleet`).
`Homes` keeps the home leases held here: it renews them (a home the store did not renew moved
to another daemon while this one was paused or cut off: the session is dropped here, its turns
stopped, its files moved aside), takes over the homes the claim rounds hand it (rebuilding the
ledger files from the store, `adoption`), gives back a session whose chain went on without this
daemon (`stale`, then `resync`), and answers whether a session is still homed here by this
daemon's own clock (`homed`).

It is apart from the fleet's rounds (`fleet.Fleet`), which decide when each of these happens,
and from the peers and the hand-over, which only read which homes are held.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread

from supervisor.logging import get_logger
from supervisor.store.fleet import FleetStore, SessionHome
from supervisor.store.protocol import Claim
from supervisor.turns.adoption import adopted_as, move_aside, rebuild_ledgers
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import TurnDeps
from supervisor.turns.leases import LeaseClock
from supervisor.turns.sessions import SessionLike

__all__ = ["Homes"]


class Homes:
    """The home leases held here: renewed, lost, taken over and given back."""

    def __init__(
        self,
        deps: TurnDeps,
        store: FleetStore,
        anchors: LedgerAnchors,
        *,
        unpark: Callable[[int], bool],
    ) -> None:
        self._deps = deps
        self._store = store
        self._anchors = anchors
        #: take a parked turn off its queue (True when it was parked: it has no task to cancel)
        self._unpark = unpark
        self._log = get_logger("supervisor.turns.fleet")
        self._held: dict[str, SessionHome] = {}
        #: until when the homes renewed last hold, by this daemon's clock (`leases`)
        self._clock = LeaseClock(deps.settings.lease_ms)
        self._renewing = anyio.Lock()
        #: sessions whose chain here went stale (the store refused a line as a fork, or an
        #: anchor as another daemon's): dropped and given back at the next claim round
        self._stale: set[str] = set()
        #: sessions homed here again after a restart on the root that homed them (their
        #: ledger files were here, in agreement with the store): what they were running was
        #: interrupted by that restart, not taken over from another daemon
        self._restarted: set[str] = set()

    # -- views ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._held

    def ids(self) -> frozenset[str]:
        return frozenset(self._held)

    def get(self, session_id: str) -> SessionHome | None:
        return self._held.get(session_id)

    def came_back(self, session_id: str) -> bool:
        """The session was homed here again after this root's own daemon restarted."""
        return session_id in self._restarted

    @property
    def stale_pending(self) -> bool:
        """Some session's chain here went stale: `resync` gives it back."""
        return bool(self._stale)

    def live(self) -> bool:
        """The homes renewed last still hold by this daemon's clock."""
        return self._clock.live()

    def late_s(self) -> float:
        return self._clock.late_s()

    # -- the hand-over's moves --------------------------------------------------------------

    def give_up(self, session_id: str) -> None:
        """Forget the home (its release in the store follows): no claim takes its turns here."""
        del self._held[session_id]

    def keep(self, home: SessionHome) -> None:
        """Hold *home* again (its release failed), unless the session is homed here anew."""
        self._held.setdefault(home.session_id, home)

    # -- leases -----------------------------------------------------------------------------

    async def renew(self) -> None:
        """Renew the homes held here; a home the store did not renew moved to another daemon
        while this one was paused or cut off: its session is dropped here."""
        clock = self._clock
        clock.set_lease(self._deps.settings.lease_ms)
        started = clock.now()
        held = list(self._held.values())
        if held:
            kept = {
                h.session_id: h
                for h in await self._store.renew_homes(held, lease_ms=self._deps.settings.lease_ms)
            }
            for home in held:
                renewed = kept.get(home.session_id)
                if renewed is not None:
                    if self._held.get(home.session_id) is home:
                        self._held[home.session_id] = renewed
                elif self._held.get(home.session_id) is home:
                    await self.drop(home.session_id, reason="home lost")
        clock.renewed(started)

    def stale(self, session_id: str) -> None:
        """The store refused a line of *session_id* from here as not continuing its chain (or
        the session as homed elsewhere): this daemon's copy is stale. The next claim round
        drops it and gives its home back, so that it is rebuilt from the store (here or on
        another daemon) before anything else is appended."""
        if session_id in self._held:
            self._stale.add(session_id)

    async def resync(self) -> None:
        """Drop the sessions gone stale here and give their homes back."""
        stale, self._stale = self._stale, set()
        for session_id in sorted(stale):
            home = self._held.get(session_id)
            await self.drop(session_id, reason="its ledger chain went on without this daemon")
            if home is not None:
                await self._store.release_home(home)

    async def homed(self, session_id: str) -> bool:
        """Whether this daemon still homes *session_id* under a live home lease by its own
        clock; after a pause past the margin the store is asked first (`lapsed`)."""
        if not self._clock.live():
            async with self._renewing:
                if not self._clock.live():
                    await self.lapsed(self._clock.late_s())
        return session_id in self._held and self._clock.live()

    async def lapsed(self, late_s: float) -> None:
        """This daemon's leases ran out by its own clock (it was paused or starved): read from
        the store which homes it still holds, drop the others (their turns stop, their claims
        are released in the store) before any work goes on."""
        self._log.warning("fleet_lease_lapsed", late_ms=round(late_s * 1000), homes=len(self._held))
        await self.renew()

    async def release_all(self) -> None:
        """Give every home back in the store (on the way out: the others take over at once)."""
        for home in list(self._held.values()):
            await self._store.release_home(home)

    # -- sessions ---------------------------------------------------------------------------

    async def opened(self, session: SessionLike) -> None:
        """A session just opened here: this daemon is its home, and its first ledger lines
        are anchored before the client hears of it."""
        home = await self._store.home_session(
            session.session_id, self._deps.owner, lease_ms=self._deps.settings.lease_ms
        )
        self._held[session.session_id] = home
        await self._anchors.anchor(session)

    async def closed(self, session_id: str) -> None:
        home = self._held.pop(session_id, None)
        if home is not None:
            await self._store.release_home(home)

    async def adopt(self, home: SessionHome) -> None:
        """Take over the session of *home* (claimed by this daemon): rebuild its ledger files
        from the store's lines, load it, and hold its home; on failure the home goes back."""
        deps = self._deps
        record = home.session
        sid = record.session_id
        if deps.sessions.get(sid) is not None:
            # Its home lapsed here (this daemon was paused or cut off past the lease) and the
            # store handed it back: never a takeover of its own session. What runs here stops
            # and the files go aside; the session is rebuilt from the store like any other,
            # since another daemon may have homed it and appended meanwhile.
            await self.drop(sid, reason="its home lapsed here and was claimed again")
        lines = await deps.store.ledger_lines([f"{sid}/exec", f"{sid}/evidence"])
        try:
            appended, forked = await anyio.to_thread.run_sync(
                rebuild_ledgers, deps.settings.root, record.tier, sid, lines
            )
        except Exception as exc:
            self._log.error("session_adopt_failed", session_id=sid, error=str(exc))
            await self._store.release_home(home)
            return
        if not await deps.sessions.resume(record):
            await self._store.release_home(home)
            return
        session = deps.sessions.get(sid)
        assert session is not None
        self._anchors.adopted(session)
        self._anchors.noted(lines)
        self._held[sid] = home
        how = adopted_as(ledger_lines=len(lines), written=appended, forked=forked)
        if how == "restart":
            self._restarted.add(sid)
        else:
            self._restarted.discard(sid)
        self._log.info(
            "session_adopted",
            session_id=sid,
            adopted_as=how,
            ledger_lines=len(lines),
            lines_written=appended,
            stale_files_moved=forked,
        )

    async def drop(self, session_id: str, *, reason: str) -> None:
        """The session's home is no longer here: stop its turns, release their claims, close
        it and move its files aside."""
        self._held.pop(session_id, None)
        for claim in self._stop_turns(session_id):
            # given up in the store at once: the new home need not wait for the lease
            try:
                await self._deps.store.release(claim)
            except Exception as exc:  # taken over already, or the store is down: it lapses
                self._log.info("claim_not_released", turn_id=claim.turn_id, error=str(exc))
        session = self._deps.sessions.get(session_id)
        if session is not None:
            self._anchors.forget(session)
            async with self._deps.sessions.lock(session_id):  # no process turn mid-run
                await self._deps.sessions.close(session_id)
            tier = await self._tier(session_id)
            await anyio.to_thread.run_sync(move_aside, self._deps.settings.root, tier, session_id)
        self._log.warning("session_home_lost", session_id=session_id, reason=reason)

    def _stop_turns(self, session_id: str) -> list[Claim]:
        """The session's home moved to another daemon: its turns here stop (the store would
        refuse their writes; a process is killed by the cancellation); the claims they held,
        for the caller to release."""
        tracker = self._deps.tracker
        dropped: list[Claim] = []
        for turn_id in tracker.in_session(session_id):
            active = tracker.get(turn_id)
            if active is None:
                continue
            if active.claim is not None:
                self._log.warning(
                    "claim_lost",
                    turn_id=turn_id,
                    token=active.claim.token,
                    reason="the session's home moved to another daemon",
                )
                dropped.append(active.claim)
            active.claim = None
            active.interrupt()
            if self._unpark(turn_id):
                tracker.remove(active)
        return dropped

    async def _tier(self, session_id: str) -> str:
        try:
            return (await self._deps.store.get_session(session_id)).tier
        except Exception:
            return "default"
