"""This daemon's part in a fleet: several daemons, on several hosts, sharing one PostgreSQL.

Design notes
------------
* **Sessions have homes** (`supervisor.store.fleet`). The daemon that opens a session is its
  home; only the home appends to the session's ledgers and runs its turns. A turn submitted to
  another daemon is accepted there (durably, unclaimed) and the home claims it, woken by
  ``NOTIFY``; polling every ``poll_s`` is the fallback.
* **Heartbeats.** Every third of the lease the daemon renews its homes and writes its
  heartbeat (the turn claims are renewed by the core on the same period). A home lost meanwhile
  (the daemon was paused past its lease and another took the session over) is dropped here at
  once: the session's running turns are cancelled (their late writes would be refused by the
  fencing tokens anyway), the session is closed and its local files are moved aside, since
  the new home may already have appended to the chain.
* **Takeover.** Each round claims the homes of open sessions whose home's lease ran out (of
  packages installed here), rebuilds their ledger files from the store's anchored lines
  (`ledger.SessionLedgers.adopt`, every line checked to continue the chain), loads them, and
  then claims their turns like any other: an interrupted attempt is decided as a CRASH fault,
  exactly as after a restart.
* **Resolutions** asked of this home by another daemon are carried out here, where the
  session's ledgers are, with their entries.
* **Hand-over.** The heartbeats say which command types each daemon's executors serve. A turn
  of a command type no executor here serves, while another live daemon's do, is not claimed
  here (nor ended NO_CAPABLE_EXECUTOR if it was parked here): once nothing of its session runs
  here, the session's home is released with a reservation of one lease for a daemon serving
  the command types of its waiting turns, which takes it over like a lapsed home and runs them.
  A turn no live daemon serves is claimed, and ends NO_CAPABLE_EXECUTOR when its wait for an
  executor runs out, as on a daemon alone.

Layout
------
`Fleet` is the front the turn core holds: it runs the rounds (heartbeat, claims) and composes
one piece per concern, each in its own module: `peers.Peers` (heartbeats, who serves what),
`homes.Homes` (the home leases held here, takeover and loss, with the file work in
`adoption`), `handover.HandOver` (a session given to a daemon that serves its waiting turns)
and `elsewhere.Elsewhere` (the turns of sessions another daemon homes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import LedgerForkError
from supervisor.logging import get_logger
from supervisor.store.fleet import FleetStore, StaleHomeError
from supervisor.store.protocol import Claim, ClaimFilter, Resolution, TurnRecord
from supervisor.turns.adoption import adopted_as
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.elsewhere import Elsewhere, GetTurn
from supervisor.turns.handover import HandOver
from supervisor.turns.homes import Homes
from supervisor.turns.peers import Peers, installed_packages
from supervisor.turns.requests import TurnRequest
from supervisor.turns.sessions import SessionLike

__all__ = ["Fleet", "FleetHooks", "adopted_as", "installed_packages"]

#: Homes taken over per round (each costs a ledger rebuild), turns claimed per round.
_HOMES_PER_ROUND = 16
_TURNS_PER_ROUND = 256
_COMMAND_TYPES = frozenset(c.value for c in ExecutorCommandType)


@dataclass(frozen=True, slots=True)
class FleetHooks:
    """What the fleet asks of the rest of the daemon."""

    #: run a claimed turn here; the flag: its session came back to this root after a restart
    #: here (an attempt found running was interrupted by that restart, not taken over)
    start: Callable[[TurnRecord, Claim, bool], None]
    #: carry out a resolution on an escalated turn of a session homed here (with who decided)
    resolve: Callable[[TurnRecord, Resolution, Decision | None], Awaitable[TurnRecord]]
    #: command types the connected executors serve now
    served: Callable[[], frozenset[str]]
    #: what the heartbeat says about this daemon
    info: Callable[[], Mapping[str, object]]
    #: take a parked turn off its queue (True when it was parked: it has no task to cancel)
    unpark: Callable[[int], bool]
    #: whether a turn is parked (waits for an executor slot without a task)
    parked: Callable[[int], bool] = lambda _turn_id: False


class Fleet:
    """Session homes, heartbeats, takeover and claims of a daemon sharing its store."""

    def __init__(
        self,
        deps: TurnDeps,
        store: FleetStore,
        anchors: LedgerAnchors,
        hooks: FleetHooks,
        *,
        poll_s: float = 0.5,
    ) -> None:
        self._deps = deps
        self._store = store
        self._anchors = anchors
        self._hooks = hooks
        self._poll_s = poll_s
        self._log = get_logger("supervisor.turns.fleet")
        self._peers = Peers(deps, store, served=hooks.served, info=hooks.info)
        self._homes = Homes(deps, store, anchors, unpark=hooks.unpark)
        self._hand_over = HandOver(
            deps,
            store,
            anchors,
            self._homes,
            self._peers,
            served=hooks.served,
            unpark=hooks.unpark,
            parked=hooks.parked,
        )
        self._elsewhere = Elsewhere(deps, store)
        # The pieces' calls the turn core makes, bound once (no extra call on its paths).
        #: command types the executors of the other live daemons serve (`Peers`)
        self.served_by_peers: Callable[[], frozenset[str]] = self._peers.served_by_peers
        #: command types only another live daemon's executors serve (`Peers.peer_only`)
        self.peer_only: Callable[[], frozenset[str]] = self._peers.peer_only
        #: the store refused a line of a session from here: its copy is stale (`Homes.stale`)
        self.stale: Callable[[str], None] = self._homes.stale
        #: the session is still homed here under a live home lease (`Homes.homed`)
        self.homed: Callable[[str], Awaitable[bool]] = self._homes.homed
        #: this daemon's leases ran out by its own clock: the store is read (`Homes.lapsed`)
        self.lapsed: Callable[[float], Awaitable[None]] = self._homes.lapsed
        #: a session just opened here: this daemon is its home (`Homes.opened`)
        self.home_opened: Callable[[SessionLike], Awaitable[None]] = self._homes.opened
        #: a session closed here: its home is released (`Homes.closed`)
        self.closed: Callable[[str], Awaitable[None]] = self._homes.closed
        #: turns of a session not yet final, wherever they run (`Elsewhere.unfinished`)
        self.unfinished: Callable[[str], Awaitable[list[int]]] = self._elsewhere.unfinished
        #: a turn of a session homed elsewhere, accepted here unclaimed (`Elsewhere.accept`)
        self.accept_elsewhere: Callable[[TurnRequest], Awaitable[tuple[TurnRecord, bool]]] = (
            self._elsewhere.accept
        )
        #: a turn another daemon runs, awaited through the store (`Elsewhere.wait`)
        self.wait_elsewhere: Callable[
            [int, frozenset[TurnState], GetTurn], Awaitable[TurnRecord]
        ] = self._elsewhere.wait
        #: ask the session's home to resolve an escalation (`Elsewhere.ask_home`)
        self.ask_home: Callable[
            [TurnRecord, Resolution, GetTurn, Decision | None], Awaitable[TurnRecord]
        ] = self._elsewhere.ask_home

    # -- views ------------------------------------------------------------------------------

    @property
    def store(self) -> FleetStore:
        return self._store

    def homes(self) -> frozenset[str]:
        return self._homes.ids()

    def is_home(self, session_id: str) -> bool:
        return session_id in self._homes

    # -- lifetime ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Heartbeat, renew homes and claim work until cancelled; on the way out the homes
        are released and the heartbeat removed, so the others take over at once."""
        await self._peers.heartbeat()
        try:
            await self._peers.watch()  # what the others serve, before the first claims
        except Exception as exc:  # the store is down: the next round looks again
            self._log.error("fleet_heartbeat_failed", error=str(exc))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keep_alive, name="fleet-heartbeat")
                tg.start_soon(self._claim_loop, name="fleet-claims")
                task_status.started()
        finally:
            with anyio.move_on_after(5, shield=True):
                await self._leave()

    async def _leave(self) -> None:
        try:
            await self._homes.release_all()
            await self._store.forget_daemon(self._deps.owner)
        except Exception as exc:  # the leases run out by themselves
            self._log.warning("fleet_leave_failed", error=str(exc))

    async def _keep_alive(self) -> None:
        while True:
            await anyio.sleep(max(0.05, self._deps.settings.lease_ms / 3000))
            try:
                await self._homes.renew()
                await self._peers.heartbeat()
                await self._peers.watch()
                await self._hand_over.round()
            except Exception as exc:  # the store is down: the next round tries again
                self._log.error("fleet_heartbeat_failed", error=str(exc))

    async def _claim_loop(self) -> None:
        while True:
            try:
                await self.claim_round()
            except Exception as exc:  # the store is down: polling tries again
                self._log.error("fleet_claim_round_failed", error=str(exc))
            await self._store.wait_for_work(self._poll_s)

    async def anchor_behind(self, marks: Mapping[str, int]) -> None:
        """The ledger sync round's safety net: send the store what the files hold past it
        (lines the runtime wrote outside a turn's ending; normally none)."""
        anchors = self._anchors
        behind = {lid.rsplit("/", 1)[0] for lid, seq in marks.items() if anchors.behind(lid, seq)}
        for session_id in sorted(behind):
            session = self._deps.sessions.get(session_id)
            if session is None:
                continue
            try:
                await anchors.anchor(session)
            except (StaleHomeError, LedgerForkError) as exc:  # homed or appended elsewhere
                self._log.warning("anchor_refused", session_id=session_id, reason=str(exc))
                self._homes.stale(session_id)
        self._deps.sessions.trimmed(marks)

    # -- claims -----------------------------------------------------------------------------

    async def claim_round(self) -> None:
        """Take over lapsed homes, carry out resolutions asked of this home, claim the turns
        of the sessions homed here."""
        deps = self._deps
        homes = self._homes
        if deps.draining:
            return
        if not homes.live():  # woke from a pause: what is still homed here?
            await homes.lapsed(homes.late_s())
        if homes.stale_pending:
            await homes.resync()
        for home in await self._store.claim_homes(
            deps.owner,
            lease_ms=deps.settings.lease_ms,
            limit=_HOMES_PER_ROUND,
            packages=installed_packages(deps.settings.root),
            serves=self._hooks.served(),
        ):
            await homes.adopt(home)
        if not homes:
            return
        pending = await self._store.pending_resolutions(sorted(homes.ids()))
        for turn, resolution, decided_by in pending:
            if deps.tracker.get(turn.turn_id) is None:
                try:
                    await self._hooks.resolve(turn, resolution, Decision.from_dict(decided_by))
                except Exception as exc:  # decided meanwhile, or the store refused
                    self._log.warning(
                        "resolution_not_carried_out", turn_id=turn.turn_id, error=str(exc)
                    )
        # Every command type but those only another daemon serves: their turns wait for the
        # hand-over (`handover`). A turn no live daemon serves is claimed and meets the hub's
        # NO_CAPABLE_EXECUTOR once it waited its bound (`executors.queue_wait_s`) here.
        only = ClaimFilter(
            sessions=homes.ids(), command_types=_COMMAND_TYPES - self._peers.peer_only()
        )
        for claim in await deps.store.claim(
            deps.owner, limit=_TURNS_PER_ROUND, lease_ms=deps.settings.lease_ms, only=only
        ):
            active = deps.tracker.get(claim.turn_id)
            if active is None:
                self._hooks.start(claim.turn, claim, homes.came_back(claim.turn.session_id))
                continue
            # Its claim lapsed here (this daemon was paused or starved past the lease) and
            # the store handed it back: never a takeover of its own turn. What ran under the
            # old claim stops (its ending would be refused); the new claim goes back to the
            # store, and a later round claims the turn afresh once nothing of it runs here.
            self._log.warning("own_claim_lapsed", turn_id=claim.turn_id, token=claim.token)
            if active.claim is not None:
                active.claim = None
                active.interrupt()
                if self._hooks.unpark(claim.turn_id):
                    deps.tracker.remove(active)
            await deps.store.release(claim)
