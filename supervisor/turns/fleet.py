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
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from ledger import IntegrityError, session_dir_for
from ledger.session import SessionLedgers
from sandbox.policy.lifecycle import TurnState
from supervisor.logging import get_logger
from supervisor.store.fleet import FleetStore, SessionHome
from supervisor.store.protocol import Claim, ClaimFilter, NewTurn, Resolution, TurnRecord
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import TurnDeps
from supervisor.turns.requests import TurnRequest
from supervisor.turns.sessions import SessionLike

__all__ = ["Fleet", "FleetHooks"]

#: Homes taken over per round (each costs a ledger rebuild), turns claimed per round.
_HOMES_PER_ROUND = 16
_TURNS_PER_ROUND = 256
#: A session with turns in these states cannot be closed from any daemon.
_UNFINISHED = frozenset(
    {TurnState.ACCEPTED, TurnState.RUNNING, TurnState.WAITING_RETRY, TurnState.ESCALATED}
)


@dataclass(frozen=True, slots=True)
class FleetHooks:
    """What the fleet asks of the rest of the daemon."""

    #: run a claimed turn here
    start: Callable[[TurnRecord, Claim], None]
    #: carry out a resolution on an escalated turn of a session homed here
    resolve: Callable[[TurnRecord, Resolution], Awaitable[TurnRecord]]
    #: command types the connected executors serve now
    served: Callable[[], frozenset[str]]
    #: what the heartbeat says about this daemon
    info: Callable[[], Mapping[str, object]]
    #: take a parked turn off its queue (True when it was parked: it has no task to cancel)
    unpark: Callable[[int], bool]


def _now_us() -> int:
    return time.time_ns() // 1000


def installed_packages(root: Path) -> frozenset[str] | None:
    """Packages installed under *root* (`<root>/installed/<id>`); None when it cannot tell."""
    try:
        return frozenset(p.name for p in (root / "installed").iterdir() if p.is_dir())
    except OSError:
        return None


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
        self._homes: dict[str, SessionHome] = {}
        self._started_us = _now_us()
        self._host = socket.gethostname()
        self._log = get_logger("supervisor.turns.fleet")
        #: the other daemons seen alive at the last look (None: not looked yet)
        self._peers: set[str] | None = None

    # -- views ------------------------------------------------------------------------------

    @property
    def store(self) -> FleetStore:
        return self._store

    def homes(self) -> frozenset[str]:
        return frozenset(self._homes)

    def is_home(self, session_id: str) -> bool:
        return session_id in self._homes

    # -- lifetime ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Heartbeat, renew homes and claim work until cancelled; on the way out the homes
        are released and the heartbeat removed, so the others take over at once."""
        await self._heartbeat()
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
            for home in list(self._homes.values()):
                await self._store.release_home(home)
            await self._store.forget_daemon(self._deps.owner)
        except Exception as exc:  # the leases run out by themselves
            self._log.warning("fleet_leave_failed", error=str(exc))

    async def _keep_alive(self) -> None:
        interval = max(0.05, self._deps.settings.lease_ms / 3000)
        while True:
            await anyio.sleep(interval)
            try:
                await self._renew()
                await self._heartbeat()
                await self._watch_peers()
            except Exception as exc:  # the store is down: the next round tries again
                self._log.error("fleet_heartbeat_failed", error=str(exc))

    async def _heartbeat(self) -> None:
        await self._store.heartbeat(
            self._deps.owner,
            host=self._host,
            pid=os.getpid(),
            started_us=self._started_us,
            info=self._hooks.info(),
        )

    async def _watch_peers(self) -> None:
        """Tell the change feed which daemons of the fleet began or stopped heartbeating since
        the last look (the first look only learns who is there)."""
        feed = self._deps.tracker.feed
        if feed is None:
            return
        now = _now_us()
        lease_us = self._deps.settings.lease_ms * 1000
        seen = {d.owner: d for d in await self._store.daemons() if d.owner != self._deps.owner}
        alive = {owner for owner, d in seen.items() if now - d.heartbeat_us <= lease_us}
        known, self._peers = self._peers, alive
        if known is None:
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

    async def _renew(self) -> None:
        held = list(self._homes.values())
        if not held:
            return
        kept = {
            h.session_id: h
            for h in await self._store.renew_homes(held, lease_ms=self._deps.settings.lease_ms)
        }
        for home in held:
            renewed = kept.get(home.session_id)
            if renewed is not None:
                if self._homes.get(home.session_id) is home:
                    self._homes[home.session_id] = renewed
            elif self._homes.get(home.session_id) is home:
                await self._drop(home.session_id, reason="home lost")

    async def _claim_loop(self) -> None:
        while True:
            try:
                await self.claim_round()
            except Exception as exc:  # the store is down: polling tries again
                self._log.error("fleet_claim_round_failed", error=str(exc))
            await self._store.wait_for_work(self._poll_s)

    # -- sessions ---------------------------------------------------------------------------

    async def home_opened(self, session: SessionLike) -> None:
        """A session just opened here: this daemon is its home, and its first ledger lines
        are anchored before the client hears of it."""
        home = await self._store.home_session(
            session.session_id, self._deps.owner, lease_ms=self._deps.settings.lease_ms
        )
        self._homes[session.session_id] = home
        await self._anchors.anchor(session)

    async def closed(self, session_id: str) -> None:
        home = self._homes.pop(session_id, None)
        if home is not None:
            await self._store.release_home(home)

    async def _adopt(self, home: SessionHome) -> None:
        deps = self._deps
        record = home.session
        sid = record.session_id
        lines = await deps.store.ledger_lines([f"{sid}/exec", f"{sid}/evidence"])
        root = deps.settings.root

        def rebuild() -> tuple[int, bool]:
            try:
                return SessionLedgers.adopt(
                    root=root, tier=record.tier, session_id=sid, lines=lines
                ), False
            except IntegrityError:  # this host's files went on past the store: a stale fork
                _move_aside(root, record.tier, sid)
                return SessionLedgers.adopt(
                    root=root, tier=record.tier, session_id=sid, lines=lines
                ), True

        try:
            appended, forked = await anyio.to_thread.run_sync(rebuild)
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
        self._homes[sid] = home
        self._log.info(
            "session_adopted",
            session_id=sid,
            ledger_lines=len(lines),
            lines_written=appended,
            stale_files_moved=forked,
        )

    async def _drop(self, session_id: str, *, reason: str) -> None:
        self._homes.pop(session_id, None)
        self._stop_turns(session_id)
        session = self._deps.sessions.get(session_id)
        if session is not None:
            self._anchors.forget(session)
            async with self._deps.sessions.lock(session_id):  # no process turn mid-run
                await self._deps.sessions.close(session_id)
            tier = await self._tier(session_id)
            await anyio.to_thread.run_sync(_move_aside, self._deps.settings.root, tier, session_id)
        self._log.warning("session_home_lost", session_id=session_id, reason=reason)

    def _stop_turns(self, session_id: str) -> None:
        """The session's home moved to another daemon: its turns here stop (the store would
        refuse their writes)."""
        tracker = self._deps.tracker
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
            active.claim = None
            active.interrupt()
            if self._hooks.unpark(turn_id):
                tracker.remove(active)

    async def _tier(self, session_id: str) -> str:
        try:
            return (await self._deps.store.get_session(session_id)).tier
        except Exception:
            return "default"

    async def anchor_behind(self, marks: Mapping[str, int]) -> None:
        """The ledger sync round's safety net: send the store what the files hold past it
        (lines the runtime wrote outside a turn's ending; normally none)."""
        anchors = self._anchors
        behind = {lid.rsplit("/", 1)[0] for lid, seq in marks.items() if anchors.behind(lid, seq)}
        for session_id in sorted(behind):
            session = self._deps.sessions.get(session_id)
            if session is not None:
                await anchors.anchor(session)
        self._deps.sessions.trimmed(marks)

    # -- turns of sessions homed elsewhere ---------------------------------------------------

    async def unfinished(self, session_id: str) -> list[int]:
        """Turns of the session not yet final in the store, wherever they run (up to 100)."""
        page = await self._deps.store.list_turns(
            session_id=session_id, states=_UNFINISHED, limit=100
        )
        return [t.turn_id for t in page.turns]

    async def accept_elsewhere(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        """A turn of a session homed by another daemon: accepted here, durably and unclaimed;
        the home claims it (woken by the store) and runs it. Store errors propagate."""
        accepted = await self._deps.store.accept(
            NewTurn(
                session_id=request.session_id,
                spec=request.spec,
                idempotency_key=request.idempotency_key,
            )
        )
        if accepted.created:
            self._deps.tracker.accepted(accepted.turn)
            self._log.info(
                "turn_accepted",
                session_id=request.session_id,
                turn_number=accepted.turn.turn_number,
                turn_id=accepted.turn.turn_id,
                kind=accepted.turn.kind.value,
                home="elsewhere",
            )
        return accepted.turn, accepted.created

    async def wait_elsewhere(
        self,
        turn_id: int,
        until: frozenset[TurnState],
        get_turn: Callable[[int], Awaitable[TurnRecord]],
    ) -> TurnRecord:
        """A turn another daemon runs (or will): its state is read from the store, every 10 ms
        at first, then less often (up to 250 ms), until final, escalated or in *until*."""
        delay = 0.01
        while True:
            turn = await get_turn(turn_id)
            if turn.final or turn.state is TurnState.ESCALATED or turn.state in until:
                return turn
            active = self._deps.tracker.get(turn_id)
            if active is not None:  # claimed here meanwhile
                await active.wait_settled()
                return await get_turn(turn_id)
            await anyio.sleep(delay)
            delay = min(0.25, delay * 1.5)

    async def ask_home(
        self,
        turn: TurnRecord,
        resolution: Resolution,
        get_turn: Callable[[int], Awaitable[TurnRecord]],
    ) -> TurnRecord:
        """Ask the session's home to carry out *resolution* (it writes the ending's ledger
        entries); waits up to 10 s for it, then returns the turn as it is."""
        await self._store.request_resolution(turn.turn_id, resolution)
        self._log.info("resolution_requested", turn_id=turn.turn_id, action=resolution.value)
        delay = 0.01
        with anyio.move_on_after(10):
            while True:
                current = await get_turn(turn.turn_id)
                if current.state is not TurnState.ESCALATED:
                    return current
                await anyio.sleep(delay)
                delay = min(0.25, delay * 1.5)
        return await get_turn(turn.turn_id)

    # -- claims -----------------------------------------------------------------------------

    async def claim_round(self) -> None:
        """Take over lapsed homes, carry out resolutions asked of this home, claim the turns
        of the sessions homed here."""
        deps = self._deps
        if deps.draining:
            return
        for home in await self._store.claim_homes(
            deps.owner,
            lease_ms=deps.settings.lease_ms,
            limit=_HOMES_PER_ROUND,
            packages=installed_packages(deps.settings.root),
        ):
            await self._adopt(home)
        if not self._homes:
            return
        for turn, resolution in await self._store.pending_resolutions(sorted(self._homes)):
            if deps.tracker.get(turn.turn_id) is None:
                try:
                    await self._hooks.resolve(turn, resolution)
                except Exception as exc:  # decided meanwhile, or the store refused
                    self._log.warning(
                        "resolution_not_carried_out", turn_id=turn.turn_id, error=str(exc)
                    )
        only = ClaimFilter(sessions=frozenset(self._homes), command_types=self._hooks.served())
        for claim in await deps.store.claim(
            deps.owner, limit=_TURNS_PER_ROUND, lease_ms=deps.settings.lease_ms, only=only
        ):
            active = deps.tracker.get(claim.turn_id)
            if active is None:
                self._hooks.start(claim.turn, claim)
            else:  # its lease ran out while this daemon was paused: carry on under the new one
                active.claim = claim


def _move_aside(root: Path, tier: str, session_id: str) -> None:
    """Keep this host's copy of a session's files out of the way (`<root>/planes/<tier>/stale/`):
    another daemon appended to the chain meanwhile."""
    session_dir = session_dir_for(root, tier, session_id)
    if not session_dir.exists():
        return
    stale = session_dir.parent.parent / "stale"
    stale.mkdir(parents=True, exist_ok=True)
    session_dir.rename(stale / f"{session_id}-{_now_us()}")
