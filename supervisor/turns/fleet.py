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
from ledger.heads import HEADS_DIR
from ledger.session import SessionLedgers
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import LedgerForkError
from supervisor.logging import get_logger
from supervisor.store.fleet import DaemonRecord, FleetStore, SessionHome, StaleHomeError
from supervisor.store.protocol import Claim, ClaimFilter, NewTurn, Resolution, TurnRecord
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.leases import LeaseClock
from supervisor.turns.requests import TurnRequest
from supervisor.turns.sessions import SessionLike

__all__ = ["Fleet", "FleetHooks"]

#: Homes taken over per round (each costs a ledger rebuild), turns claimed per round.
_HOMES_PER_ROUND = 16
_TURNS_PER_ROUND = 256
_COMMAND_TYPES = frozenset(c.value for c in ExecutorCommandType)
#: A session with turns in these states cannot be closed from any daemon.
_UNFINISHED = frozenset(
    {TurnState.ACCEPTED, TurnState.RUNNING, TurnState.WAITING_RETRY, TurnState.ESCALATED}
)


@dataclass(frozen=True, slots=True)
class FleetHooks:
    """What the fleet asks of the rest of the daemon."""

    #: run a claimed turn here
    start: Callable[[TurnRecord, Claim], None]
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


def _now_us() -> int:
    return time.time_ns() // 1000


def _texts(value: object) -> list[str]:
    """A list of strings from a heartbeat's info (anything else: none)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def installed_packages(root: Path) -> frozenset[str] | None:
    """Packages installed under *root* (`<root>/installed/<id>`); None when it cannot tell."""
    try:
        return frozenset(p.name for p in (root / "installed").iterdir() if p.is_dir())
    except OSError:
        return None


def adopted_as(*, ledger_lines: int, written: int, forked: bool) -> str:
    """How a session came to be homed here, for `session_adopted`: ``"restart"`` when this
    root already held the session's ledger files, in agreement with the store (a prefix of
    its lines, perhaps all: the daemon started again on the root that homed it, and at most
    caught up what its crash kept from the files), ``"takeover"`` when they had to be written
    from the store (another daemon's session) or this root's copy had forked and was moved
    aside."""
    kept_here = ledger_lines > 0 and written < ledger_lines
    return "restart" if kept_here and not forked else "takeover"


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
        #: their last heartbeats (what each serves, its packages, whether it drains)
        self._alive: dict[str, DaemonRecord] = {}
        self._peer_serves: frozenset[str] = frozenset()
        #: until when the homes renewed last hold, by this daemon's clock (`leases`)
        self._home_clock = LeaseClock(deps.settings.lease_ms)
        self._renewing = anyio.Lock()
        #: sessions whose chain here went stale (the store refused a line as a fork, or an
        #: anchor as another daemon's): dropped and given back at the next claim round
        self._stale: set[str] = set()

    # -- views ------------------------------------------------------------------------------

    @property
    def store(self) -> FleetStore:
        return self._store

    def homes(self) -> frozenset[str]:
        return frozenset(self._homes)

    def is_home(self, session_id: str) -> bool:
        return session_id in self._homes

    def _serving_peers(self) -> list[DaemonRecord]:
        """The live daemons of the fleet that take work (not draining), as last seen."""
        return [d for d in self._alive.values() if d.info.get("draining") is not True]

    def served_by_peers(self) -> frozenset[str]:
        """Command types the executors of the other live daemons serve (their heartbeats, as
        of the last look)."""
        return self._peer_serves

    def peer_only(self) -> frozenset[str]:
        """Command types no executor here serves but another live daemon's does: a turn of
        one waits for its session to be handed over to that daemon (`_hand_over`), and does
        not end NO_CAPABLE_EXECUTOR here."""
        return self.served_by_peers() - self._hooks.served()

    def _takers(self, commands: frozenset[str], package_id: str) -> list[str]:
        """The live daemons that serve every one of *commands* and have *package_id*
        installed (a daemon that does not say which packages it has counts as having it)."""
        takers = []
        for d in self._serving_peers():
            packages = d.info.get("packages")
            has_package = not isinstance(packages, list) or package_id in packages
            if has_package and commands <= frozenset(_texts(d.info.get("serves"))):
                takers.append(d.owner)
        return sorted(takers)

    # -- lifetime ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Heartbeat, renew homes and claim work until cancelled; on the way out the homes
        are released and the heartbeat removed, so the others take over at once."""
        await self._heartbeat()
        try:
            await self._watch_peers()  # what the others serve, before the first claims
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
            for home in list(self._homes.values()):
                await self._store.release_home(home)
            await self._store.forget_daemon(self._deps.owner)
        except Exception as exc:  # the leases run out by themselves
            self._log.warning("fleet_leave_failed", error=str(exc))

    async def _keep_alive(self) -> None:
        while True:
            await anyio.sleep(max(0.05, self._deps.settings.lease_ms / 3000))
            try:
                await self._renew()
                await self._heartbeat()
                await self._watch_peers()
                await self._hand_over()
            except Exception as exc:  # the store is down: the next round tries again
                self._log.error("fleet_heartbeat_failed", error=str(exc))

    async def _heartbeat(self) -> None:
        root = self._deps.settings.root
        packages = installed_packages(root)
        await self._store.heartbeat(
            self._deps.owner,
            host=self._host,
            pid=os.getpid(),
            started_us=self._started_us,
            info={
                **self._hooks.info(),
                # what the others read: the command types served here (`served_by_peers`),
                # the packages installed (a hand-over goes only where they are) and the root
                # (`hunter ledger verify --store` tells a daemon's root from an export)
                "serves": sorted(self._hooks.served()),
                "packages": None if packages is None else sorted(packages),
                "root": str(root.resolve()),
            },
        )

    async def _watch_peers(self) -> None:
        """Note the live daemons of the fleet and what they serve, and tell the change feed
        which began or stopped heartbeating since the last look (the first look only learns
        who is there)."""
        now = _now_us()
        lease_us = self._deps.settings.lease_ms * 1000
        seen = {d.owner: d for d in await self._store.daemons() if d.owner != self._deps.owner}
        alive = {owner for owner, d in seen.items() if now - d.heartbeat_us <= lease_us}
        self._alive = {owner: seen[owner] for owner in alive}
        self._peer_serves = frozenset(
            c for d in self._serving_peers() for c in _texts(d.info.get("serves"))
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

    async def _renew(self) -> None:
        """Renew the homes held here; a home the store did not renew moved to another daemon
        while this one was paused or cut off: its session is dropped here."""
        clock = self._home_clock
        clock.set_lease(self._deps.settings.lease_ms)
        started = clock.now()
        held = list(self._homes.values())
        if held:
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
        clock.renewed(started)

    def stale(self, session_id: str) -> None:
        """The store refused a line of *session_id* from here as not continuing its chain (or
        the session as homed elsewhere): this daemon's copy is stale. The next claim round
        drops it and gives its home back, so that it is rebuilt from the store (here or on
        another daemon) before anything else is appended."""
        if session_id in self._homes:
            self._stale.add(session_id)

    async def _resync(self) -> None:
        stale, self._stale = self._stale, set()
        for session_id in sorted(stale):
            home = self._homes.get(session_id)
            await self._drop(session_id, reason="its ledger chain went on without this daemon")
            if home is not None:
                await self._store.release_home(home)

    async def homed(self, session_id: str) -> bool:
        """Whether this daemon still homes *session_id* under a live home lease by its own
        clock; after a pause past the margin the store is asked first (`lapsed`)."""
        if not self._home_clock.live():
            async with self._renewing:
                if not self._home_clock.live():
                    await self.lapsed(self._home_clock.late_s())
        return session_id in self._homes and self._home_clock.live()

    async def lapsed(self, late_s: float) -> None:
        """This daemon's leases ran out by its own clock (it was paused or starved): read from
        the store which homes it still holds, drop the others (their turns stop, their claims
        are released in the store) before any work goes on."""
        self._log.warning(
            "fleet_lease_lapsed", late_ms=round(late_s * 1000), homes=len(self._homes)
        )
        await self._renew()

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
        if deps.sessions.get(sid) is not None:
            # Its home lapsed here (this daemon was paused or cut off past the lease) and the
            # store handed it back: never a takeover of its own session. What runs here stops
            # and the files go aside; the session is rebuilt from the store like any other,
            # since another daemon may have homed it and appended meanwhile.
            await self._drop(sid, reason="its home lapsed here and was claimed again")
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
            adopted_as=adopted_as(ledger_lines=len(lines), written=appended, forked=forked),
            ledger_lines=len(lines),
            lines_written=appended,
            stale_files_moved=forked,
        )

    async def _drop(self, session_id: str, *, reason: str) -> None:
        self._homes.pop(session_id, None)
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
            await anyio.to_thread.run_sync(_move_aside, self._deps.settings.root, tier, session_id)
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
            if self._hooks.unpark(turn_id):
                tracker.remove(active)
        return dropped

    async def _hand_over(self) -> None:
        """Hand the sessions homed here over to a daemon that can run their waiting turns:
        those with an instruction turn of a command type no executor here serves while the
        executors of another live daemon (with the session's package installed) do. A session
        is handed over only while nothing of it runs here (its turns here, if any, are parked)
        and only to a daemon that serves every command type of its waiting turns."""
        deps = self._deps
        if deps.draining or not self._homes:
            return
        wanted = self.peer_only()
        if not wanted:
            return
        waiting: dict[str, set[str]] = {}
        for sid, command in await self._store.waiting_turns(deps.owner, sorted(self._homes)):
            waiting.setdefault(sid, set()).add(command)
        for sid, commands in waiting.items():
            home = self._homes.get(sid)
            if home is None or not commands & wanted or not self._idle(sid):
                continue
            takers = self._takers(frozenset(commands), home.session.package_id)
            if takers:
                await self._hand(home, frozenset(commands), takers)

    def _idle(self, session_id: str) -> bool:
        """Nothing of the session runs here: its turns here, if any, are parked."""
        tracker = self._deps.tracker
        return not self._deps.sessions.lock(session_id).locked() and all(
            self._hooks.parked(turn_id) for turn_id in tracker.in_session(session_id)
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
            if active is None or not self._hooks.unpark(turn_id):
                continue
            if active.claim is not None:
                given_back.append(active.claim)
                active.claim = None
            tracker.remove(active)
        del self._homes[sid]  # no claim of this round or the next takes its turns here
        try:
            for claim in given_back:
                await deps.store.release(claim)
            await self._store.release_home(home, reserve_ms=deps.settings.lease_ms)
        except Exception as exc:  # the store is down: still its home; the next round retries
            self._homes.setdefault(sid, home)
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
            + ", ".join(sorted(commands - self._hooks.served()))
            + "; the executors of another daemon do",
        )

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
            if session is None:
                continue
            try:
                await anchors.anchor(session)
            except (StaleHomeError, LedgerForkError) as exc:  # homed or appended elsewhere
                self._log.warning("anchor_refused", session_id=session_id, reason=str(exc))
                self.stale(session_id)
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
        decision: Decision | None = None,
    ) -> TurnRecord:
        """Ask the session's home to carry out *resolution* (it writes the ending's ledger
        entries, with *decision*: who asked and why); waits up to 10 s for it, then returns the
        turn as it is."""
        await self._store.request_resolution(
            turn.turn_id,
            resolution,
            decided_by=None if decision is None else decision.to_dict(),
        )
        self._log.info(
            "resolution_requested",
            turn_id=turn.turn_id,
            action=resolution.value,
            uid=None if decision is None else decision.uid,
            operator=None if decision is None else decision.operator,
            reason=None if decision is None else decision.reason,
        )
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
        if not self._home_clock.live():  # woke from a pause: what is still homed here?
            await self.lapsed(self._home_clock.late_s())
        if self._stale:
            await self._resync()
        for home in await self._store.claim_homes(
            deps.owner,
            lease_ms=deps.settings.lease_ms,
            limit=_HOMES_PER_ROUND,
            packages=installed_packages(deps.settings.root),
            serves=self._hooks.served(),
        ):
            await self._adopt(home)
        if not self._homes:
            return
        pending = await self._store.pending_resolutions(sorted(self._homes))
        for turn, resolution, decided_by in pending:
            if deps.tracker.get(turn.turn_id) is None:
                try:
                    await self._hooks.resolve(turn, resolution, Decision.from_dict(decided_by))
                except Exception as exc:  # decided meanwhile, or the store refused
                    self._log.warning(
                        "resolution_not_carried_out", turn_id=turn.turn_id, error=str(exc)
                    )
        # Every command type but those only another daemon serves: their turns wait for the
        # hand-over (`_hand_over`). A turn no live daemon serves is claimed and meets the hub's
        # NO_CAPABLE_EXECUTOR once it waited its bound (`executors.queue_wait_s`) here.
        only = ClaimFilter(
            sessions=frozenset(self._homes), command_types=_COMMAND_TYPES - self.peer_only()
        )
        for claim in await deps.store.claim(
            deps.owner, limit=_TURNS_PER_ROUND, lease_ms=deps.settings.lease_ms, only=only
        ):
            active = deps.tracker.get(claim.turn_id)
            if active is None:
                self._hooks.start(claim.turn, claim)
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


def _move_aside(root: Path, tier: str, session_id: str) -> None:
    """Keep this host's copy of a session's files out of the way (`<root>/planes/<tier>/stale/`):
    another daemon appended to the chain meanwhile. Their anchored heads go with them (to the
    same place under `<root>/state/ledger-heads/`): a later takeover rebuilds the files from
    the store, and must not find an anchor of the old copy saying they were truncated."""
    stamp = f"{session_id}-{_now_us()}"
    session_dir = session_dir_for(root, tier, session_id)
    heads = root.joinpath(*HEADS_DIR).joinpath(session_dir.relative_to(root))
    for found, stale_dir in (
        (session_dir, session_dir.parent.parent / "stale"),
        (heads, heads.parent.parent / "stale"),
    ):
        if found.exists():
            stale_dir.mkdir(parents=True, exist_ok=True)
            found.rename(stale_dir / stamp)
