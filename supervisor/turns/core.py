"""The turn core's front: what the control API calls, composed of one piece per concern.

Design notes
------------
* **One owner per turn.** A turn runs in this daemon only while it holds the turn's claim (a
  lease with a fencing token, `supervisor.store.protocol`). Accepting a turn claims it at once
  (no polling on the hot path). Claims are renewed every third of the lease; a claim lost
  meanwhile cancels that turn here (its late writes would be refused by the store anyway).
* **Kinds supply one attempt.** `instruction.run_instruction_turn` and
  `process.run_process_turn` run a turn to its ending; both go through the one attempt loop.
  The front never runs a kind's work inline: `runner.TurnRunner` starts each turn in a task
  (or parks it until an executor slot frees) and ends the ones that fail or are cancelled.
* **Restart.** `run` first resumes the open sessions, then takes back every unfinished turn
  (`store.recover`): an attempt that was running is decided as a CRASH fault
  (`lifecycle.interrupted_outcome`), a turn waiting for a retry sleeps the rest of its backoff,
  an accepted one starts. Escalated turns stay parked in the store until someone resolves them.
* **Escalations** are resolved in the store (from any daemon on a shared store): retry puts the
  turn back to ``accepted`` and this daemon claims it and runs it; terminate and cancel end it,
  with its ledger entries written first.
* **Drain.** `drain` stops new attempts and waits (up to a grace deadline) for running ones.
  What is still running when the daemon then cancels everything stays ``running`` in the store:
  the next start (or another daemon, once the lease expires) decides it as a CRASH.

Layout
------
`TurnCore` wires the pieces and keeps what lies on a turn's path (the submit call with its
idempotency check, the task-less submit, the waits and reads), so that no call of a turn passes
through an extra layer. The rest is delegated, each to the module named after its noun:
`lifetime.Lifetime` (the task group, restart recovery, standing tasks, drain),
`session_desk.SessionDesk` (sessions opened, closed, read, verified), `acceptance.Acceptance`
(the submit path with a task), `intake.Intake` (the task-less one),
`interventions.Interventions` (cancels and resolutions), `escalations.Escalations`,
`runner.TurnRunner` and, in a fleet, `fleet.Fleet`.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc

from sandbox.policy.budget import BudgetStatistics
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import RequestError, UnknownTurnError
from supervisor.feed import Feed
from supervisor.store.fleet import DaemonRecord, FleetStore
from supervisor.store.protocol import (
    SessionRecord,
    StoreStatistics,
    TurnPage,
    TurnRecord,
    TurnStore,
)
from supervisor.turns.acceptance import Acceptance
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import CoreSettings, LiveSettings, TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.escalations import Escalations
from supervisor.turns.fleet import Fleet, FleetHooks
from supervisor.turns.instruction import HubLike, monotonic_ms
from supervisor.turns.intake import Answer, Intake, SessionGate
from supervisor.turns.interventions import Interventions
from supervisor.turns.leases import LeaseClock
from supervisor.turns.lifetime import Lifetime
from supervisor.turns.requests import TurnRequest, idempotency_conflict
from supervisor.turns.runner import TurnRunner, error_code
from supervisor.turns.session_desk import SessionDesk
from supervisor.turns.sessions import DaemonSessions, RuntimeLike
from supervisor.turns.tracker import Tracker, TrackerStatistics, TurnEvents

__all__ = ["Answer", "CoreStatistics", "TurnCore", "error_code"]

#: A page of `turns.list` / `escalations.list` when the caller does not say.
_PAGE = 500


@dataclass(frozen=True, slots=True)
class CoreStatistics:
    sessions_open: int
    draining: bool
    owner: str
    turns: TrackerStatistics
    #: instruction turns waiting, without a task, for an executor slot (by command type)
    parked_by_command: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "sessions_open": self.sessions_open,
            "draining": self.draining,
            "owner": self.owner,
            **self.turns.to_dict(),
            "parked_by_command": dict(self.parked_by_command),
        }


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class TurnCore:
    """Accepts, runs and ends turns; the control API calls its public coroutines."""

    def __init__(
        self,
        *,
        store: TurnStore,
        hub: HubLike,
        runtime: RuntimeLike,
        settings: CoreSettings | None = None,
        owner: str | None = None,
        events: TurnEvents | None = None,
        fleet: FleetStore | None = None,
        fleet_poll_s: float = 0.5,
        traced: bool = False,
        feed: Feed | None = None,
    ) -> None:
        settings = settings or CoreSettings()
        owner = owner or _owner_id()
        self._hub = hub
        self._deps = TurnDeps(
            store=store,
            tracker=Tracker(events=events, feed=feed),
            sessions=DaemonSessions(runtime),
            live=LiveSettings(settings),
            owner=owner,
            process_limiter=anyio.CapacityLimiter(max(1, settings.process_slots)),
            anchors=LedgerAnchors(fleet, owner) if fleet is not None else None,
            traced=traced,
            leases=LeaseClock(settings.lease_ms, enforced=fleet is not None),
            homed=self._homed if fleet is not None else None,
            stale_session=self._stale_session,
        )
        # Submissions past their session check but not yet started, and sessions being closed:
        # each refuses while the other is under way, so no turn lands in a closed session.
        gate = SessionGate()
        self._runner = runner = TurnRunner(self._deps, hub)
        self._escalations = Escalations(self._deps, start=runner.start, fleet=fleet is not None)
        self._fleet: Fleet | None = None
        if fleet is not None and self._deps.anchors is not None:
            hooks = FleetHooks(
                start=lambda turn, claim, came_back: runner.start(
                    turn, claim, recovered=True, taken_over=not came_back
                ),
                resolve=self._escalations.resolve,
                served=self._served,
                info=lambda: self.statistics().to_dict(),
                unpark=runner.unpark,
                parked=runner.is_parked,
            )
            self._fleet = Fleet(self._deps, fleet, self._deps.anchors, hooks, poll_s=fleet_poll_s)
            peer_only = self._fleet.peer_only
            runner.served_elsewhere = lambda command: command.value in peer_only()
        self._sessions = SessionDesk(self._deps, gate, fleet=self._fleet)
        acceptance = Acceptance(
            self._deps, gate, hub, runner, get_session=self._sessions.get, fleet=self._fleet
        )
        #: the submit path with a task (`acceptance`), bound once: no extra call on it
        self._accept = acceptance.accept
        self._intake = Intake(
            self._deps,
            gate,
            admit=acceptance.admit,
            start=lambda turn, claim: runner.start(turn, claim, recovered=False),
        )
        self._interventions = Interventions(
            self._deps,
            runner,
            get_turn=self.get_turn,
            resolve=self._escalations.resolve,
            fleet=self._fleet,
        )
        self._lifetime = Lifetime(self._deps, runner, intake=self._intake.run, fleet=self._fleet)

    # -- settings and views -----------------------------------------------------------------

    @property
    def settings(self) -> CoreSettings:
        return self._deps.settings

    @settings.setter
    def settings(self, settings: CoreSettings) -> None:
        self._deps.live.current = settings
        self._deps.leases.set_lease(settings.lease_ms)

    @property
    def feed(self) -> Feed | None:
        """The change feed the turn core publishes to (`supervisor.feed`)."""
        return self._deps.tracker.feed

    @property
    def draining(self) -> bool:
        return self._deps.draining

    def retry_budget(self) -> BudgetStatistics:
        """The daemon-wide retry budget's window now (`sandbox.policy.budget`)."""
        deps = self._deps
        return deps.retry_budget.statistics(monotonic_ms(), deps.settings.retry_budget)

    @property
    def owner(self) -> str:
        return self._deps.owner

    def statistics(self) -> CoreStatistics:
        return CoreStatistics(
            sessions_open=len(self._deps.sessions),
            draining=self._deps.draining,
            owner=self._deps.owner,
            turns=self._deps.tracker.statistics(),
            parked_by_command={
                c.value: n for c in ExecutorCommandType if (n := self._runner.parked(c))
            },
        )

    def store_statistics(self) -> StoreStatistics:
        return self._deps.store.statistics()

    def in_flight(self, limit: int | None = None) -> list[dict[str, object]]:
        return self._deps.tracker.in_flight(limit)

    # -- lifetime (`lifetime.Lifetime`) -----------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Resume sessions and unfinished turns, then run turns until cancelled."""
        await self._lifetime.run(task_status=task_status)

    async def drain(self, grace_s: float) -> bool:
        """Stop starting attempts; wait up to *grace_s* for running ones. True when none is left."""
        return await self._lifetime.drain(grace_s)

    # -- the fleet --------------------------------------------------------------------------

    def _stale_session(self, session_id: str) -> None:
        if self._fleet is not None:
            self._fleet.stale(session_id)

    async def _homed(self, session_id: str) -> bool:
        """In a fleet: the session is still homed here under a live home lease."""
        return self._fleet is not None and await self._fleet.homed(session_id)

    def _served(self) -> frozenset[str]:
        return frozenset(c.value for c in ExecutorCommandType if self._hub.serving(c) > 0)

    def served_by_peers(self) -> frozenset[str] | None:
        """In a fleet, the command types the executors of the other live daemons serve, as
        their last heartbeats say (None: this daemon is alone on its store)."""
        return None if self._fleet is None else self._fleet.served_by_peers()

    async def daemons(self) -> list[DaemonRecord] | None:
        """Every daemon sharing the store, with its last heartbeat (None: no fleet)."""
        if self._fleet is None:
            return None
        return await self._fleet.store.daemons()

    # -- sessions (`session_desk.SessionDesk`) ----------------------------------------------

    async def open_session(
        self,
        *,
        package_id: str,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
    ) -> SessionRecord:
        return await self._sessions.open(
            package_id=package_id,
            tier=tier,
            work_order_id=work_order_id,
            workspace=workspace,
            tenant=tenant,
            priority=priority,
        )

    async def close_session(self, session_id: str) -> SessionRecord:
        return await self._sessions.close(session_id)

    async def list_sessions(self) -> list[SessionRecord]:
        return await self._sessions.records()

    async def get_session(self, session_id: str) -> SessionRecord:
        return await self._sessions.get(session_id)

    async def verify_ledgers(self, *, session_id: str | None = None) -> dict[str, object]:
        """Verify the exec and evidence ledgers of one session (or of every session). In a
        fleet, only those of the sessions this daemon homes (or no daemon does, when their
        files are here): the others are listed as checked on their home (`verify_ledgers`)."""
        return await self._sessions.verify_ledgers(session_id=session_id)

    # -- turns ------------------------------------------------------------------------------

    async def submit(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        """Validate, admit and durably accept a turn; returns ``(turn, created)``.

        ``created`` is False when the request's idempotency key already names a turn of the
        session: that first turn comes back if the request asks for the same turn, else
        ``idempotency_conflict`` is raised (`requests.idempotency_conflict`). This holds
        whichever way the first turn is found: by the look-up of the submit path
        (`acceptance.Acceptance.accept`), or by the store's accept when a submission with the
        same key was accepted meanwhile (the unique key), here or by another daemon of a
        fleet."""
        turn, created = await self._accept(request)
        if not created:
            conflict = idempotency_conflict(request, turn)
            if conflict is not None:
                raise conflict
        return turn, created

    def submit_soon(self, request: TurnRequest, answer: Answer) -> bool:
        """`submit` without a task, for the common case (`intake.Intake.submit_soon`)."""
        return self._intake.submit_soon(request, answer)

    def settled_soon(
        self, turn_id: int, done: Callable[[TurnRecord | None], None]
    ) -> Callable[[], None] | None:
        """`wait_turn` without a task: *done* is called with the turn once it is final, or
        with None when it settled another way (escalated, lost: read it with `get_turn`).
        Returns the call that forgets the wait (on the caller's timeout), or None when the
        turn is not watched here (use `wait_turn`)."""
        tracker = self._deps.tracker
        active = tracker.get(turn_id)
        if active is None or active.settled:
            return None

        def settled() -> None:
            self._deps.sessions.write_pending()
            done(tracker.recent(turn_id))

        active.watch(settled)
        return lambda: active.unwatch(settled)

    async def get_turn(self, turn_id: int) -> TurnRecord:
        # A caller may read the ledger files next: committed lines waiting for the flusher's
        # pass go now (nothing to do unless a turn ended in this very pass).
        self._deps.sessions.write_pending()
        cached = self._deps.tracker.recent(turn_id)
        if cached is not None:
            return cached
        try:
            return await self._deps.store.get_turn(turn_id)
        except UnknownTurnError:
            raise RequestError(
                "unknown_turn", f"no turn {turn_id}; see `hunter status`", turn_id=turn_id
            ) from None

    async def wait_turn(
        self,
        turn_id: int,
        *,
        timeout_s: float | None = None,
        until: frozenset[TurnState] = frozenset(),
    ) -> TurnRecord:
        """Wait until the turn is final or parked (escalated), or its state is in *until*,
        or *timeout_s* passes; returns the turn as it is then."""
        limit = self.settings.wait_limit_s if timeout_s is None else timeout_s
        with anyio.move_on_after(limit):
            while True:
                active = self._deps.tracker.get(turn_id)
                if active is None and self._fleet is not None:
                    return await self._fleet.wait_elsewhere(turn_id, until, self.get_turn)
                if active is None or active.settled or active.state in until:
                    break
                if until:
                    await active.wait_changed()
                else:
                    await active.wait_settled()
        return await self.get_turn(turn_id)

    async def cancel_turn(self, turn_id: int, decision: Decision | None = None) -> TurnRecord:
        """Cancel a turn that is not final; *decision*: who asked and why (recorded with the
        ending as ``decided_by``, `supervisor.turns.decisions`)."""
        return await self._interventions.cancel(turn_id, decision)

    async def list_turns(
        self,
        *,
        session_id: str | None = None,
        states: frozenset[TurnState] | None = None,
        package_id: str | None = None,
        accepted_since_us: int | None = None,
        accepted_until_us: int | None = None,
        after_turn_id: int = 0,
        limit: int = _PAGE,
    ) -> list[TurnRecord]:
        """A page of the turns the filters keep (`TurnStore.list_turns`), oldest first."""
        page = await self._deps.store.list_turns(
            session_id=session_id,
            states=states,
            package_id=package_id,
            accepted_since_us=accepted_since_us,
            accepted_until_us=accepted_until_us,
            after_turn_id=after_turn_id,
            limit=limit,
        )
        return list(page.turns)

    async def counts(self) -> dict[str, int]:
        return await self._deps.store.counts()

    # -- escalations ------------------------------------------------------------------------

    async def list_escalations(self, *, after_turn_id: int = 0, limit: int = 500) -> TurnPage:
        """A page of the turns parked for an operator, by turn id."""
        return await self._escalations.list(after_turn_id=after_turn_id, limit=limit)

    async def resolve_escalation(
        self, turn_id: int, action: str, decision: Decision | None = None
    ) -> TurnRecord:
        """An operator's decision for a parked turn: ``retry`` or ``terminate``; *decision*:
        who took it and why (recorded as ``decided_by``, `supervisor.turns.decisions`)."""
        return await self._interventions.resolve_escalation(turn_id, action, decision)
