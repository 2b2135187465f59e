"""The turn core's front: what the control API calls, and the task group every turn runs in.

The module is a little over 600 lines and `TurnCore` about 500: it is the one seam the control
API calls (sessions, submit, waits, cancel, lists, escalations, drain); each method is short
and delegates (runner, intake, escalations, recovery, the store).

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
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.to_thread

from sandbox.policy.budget import BudgetStatistics
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import (
    QueueFullError,
    RequestError,
    SessionClosedError,
    UnknownSessionError,
    UnknownTurnError,
)
from supervisor.feed import Feed
from supervisor.logging import get_logger, info_enabled
from supervisor.stages import stage_costs
from supervisor.store.fleet import DaemonRecord, FleetStore
from supervisor.store.protocol import (
    Claim,
    NewSession,
    NewTurn,
    Resolution,
    SessionRecord,
    SessionState,
    StoreStatistics,
    TurnEnding,
    TurnPage,
    TurnRecord,
    TurnStore,
)
from supervisor.turns.anchors import LedgerAnchors
from supervisor.turns.context import CoreSettings, LiveSettings, TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.escalations import Escalations
from supervisor.turns.fleet import Fleet, FleetHooks
from supervisor.turns.instruction import HubLike, monotonic_ms
from supervisor.turns.intake import Answer, Intake, SessionGate
from supervisor.turns.leases import LeaseClock, renew_claims
from supervisor.turns.recovery import catch_up_ledgers, roll_forward
from supervisor.turns.requests import TurnRequest, idempotency_conflict
from supervisor.turns.runner import TurnRunner, error_code
from supervisor.turns.sessions import DaemonSessions, RuntimeLike, SessionLike, verify_ledgers
from supervisor.turns.tracker import ActiveTurn, Tracker, TrackerStatistics, TurnEvents

__all__ = ["Answer", "CoreStatistics", "TurnCore", "error_code"]

_COSTS = stage_costs()

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
        self._log = get_logger("supervisor.turns")
        # Submissions past their session check but not yet started, and sessions being closed:
        # each refuses while the other is under way, so no turn lands in a closed session.
        self._gate = SessionGate()
        self._runner = TurnRunner(self._deps, hub)
        self._intake = Intake(
            self._deps,
            self._gate,
            admit=self._admit,
            start=lambda turn, claim: self._runner.start(turn, claim, recovered=False),
        )
        self._escalations = Escalations(
            self._deps, start=self._runner.start, fleet=fleet is not None
        )
        self._fleet: Fleet | None = None
        if fleet is not None and self._deps.anchors is not None:
            hooks = FleetHooks(
                start=lambda turn, claim: self._runner.start(turn, claim, recovered=True),
                resolve=self._escalations.resolve,
                served=self._served,
                info=lambda: self.statistics().to_dict(),
                unpark=self._runner.unpark,
                parked=self._runner.is_parked,
            )
            self._fleet = Fleet(self._deps, fleet, self._deps.anchors, hooks, poll_s=fleet_poll_s)
            peer_only = self._fleet.peer_only
            self._runner.served_elsewhere = lambda command: command.value in peer_only()

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

    # -- lifetime ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Resume sessions and unfinished turns, then run turns until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._runner.attach(tg)
                if self._fleet is not None:  # homes and turns come from the fleet's rounds
                    await tg.start(self._fleet.run)
                else:
                    await self._recover()
                tg.start_soon(
                    functools.partial(
                        renew_claims,
                        self._deps.store,
                        self._deps.tracker,
                        self._deps.leases,
                        lease_ms=lambda: self.settings.lease_ms,
                        owner=self._deps.owner,
                        lost=self._claim_lost,
                        lapsed=self._lapsed,
                    ),
                    name="lease-renewal",
                )
                tg.start_soon(self._sync_ledgers, name="ledger-sync")
                tg.start_soon(self._deps.sessions.run_flusher, name="ledger-flush")
                tg.start_soon(self._deps.starts.run, name="attempt-starts")
                tg.start_soon(self._runner.feed_parked, name="parked-turns")
                tg.start_soon(self._runner.run_flights, name="instruction-endings")
                tg.start_soon(self._intake.run, name="instruction-intake")
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._runner.attach(None)
            self._deps.sessions.close_all()

    async def _recover(self) -> None:
        store = self._deps.store
        sessions = self._deps.sessions
        for record in await store.list_sessions(state=SessionState.OPEN):
            if await sessions.resume(record):
                session = sessions.get(record.session_id)
                assert session is not None
                await catch_up_ledgers(store, sessions, session)
        claims = await store.recover(self._deps.owner, lease_ms=self.settings.lease_ms)
        claims = await roll_forward(store, sessions, claims)
        for claim in claims:
            if self._deps.sessions.get(claim.turn.session_id) is None:
                await self._end_without_session(claim)
                continue
            self._runner.start(claim.turn, claim, recovered=True)
        if claims:
            self._log.info("turns_recovered", count=len(claims))

    async def _end_without_session(self, claim: Claim) -> None:
        await self._deps.store.finish(
            claim,
            TurnEnding(
                state=TurnState.TERMINATED,
                verdict="TERMINATE",
                reason_code="SESSION_UNAVAILABLE",
                reason="the turn's session could not be resumed after a restart",
            ),
        )

    def _claim_lost(self, active: ActiveTurn) -> None:
        """A renewal round found the turn's claim taken over: stop what runs it (a process is
        killed by the cancellation); its late result is refused (`ClaimLostError`)."""
        active.claim = None
        active.interrupt()
        if self._runner.unpark(active.turn_id):
            self._deps.tracker.remove(active)

    def _stale_session(self, session_id: str) -> None:
        if self._fleet is not None:
            self._fleet.stale(session_id)

    async def _homed(self, session_id: str) -> bool:
        """In a fleet: the session is still homed here under a live home lease."""
        return self._fleet is not None and await self._fleet.homed(session_id)

    async def _lapsed(self, late_s: float) -> None:
        """The leases' account ran out (a pause): the fleet reads its homes first."""
        if self._fleet is not None:
            await self._fleet.lapsed(late_s)

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

    async def _sync_ledgers(self) -> None:
        """Sync the ledger files in rounds and trim the lines the store kept for them (a
        turn's lines are durable in the store from its ending's commit on)."""
        interval = max(0.01, self.settings.ledger_sync_interval_s)
        while True:
            await anyio.sleep(interval)
            try:
                marks = await self._deps.sessions.sync_ledgers()
                if marks and self._fleet is not None:
                    await self._fleet.anchor_behind(marks)
                elif marks:
                    await self._deps.store.trim_ledger_lines(marks)
                    self._deps.sessions.trimmed(marks)
            except Exception as exc:  # the lines stay kept; the next round tries again
                self._log.error("ledger_sync_round_failed", error=str(exc))

    async def drain(self, grace_s: float) -> bool:
        """Stop starting attempts; wait up to *grace_s* for running ones. True when none is left."""
        self._deps.drain.begin()
        tracker = self._deps.tracker
        self._log.info("drain_started", attempts_running=tracker.attempts_running, grace_s=grace_s)
        with anyio.move_on_after(grace_s):
            await tracker.wait_idle()
        clean = tracker.attempts_running == 0
        self._log.info("drain_finished", clean=clean, attempts_left=tracker.attempts_running)
        return clean

    # -- sessions ---------------------------------------------------------------------------

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
        if self._deps.draining:
            raise RequestError("draining", "the daemon is draining; open the session after restart")
        try:
            session = await self._deps.sessions.open(
                package_id=package_id, tier=tier, work_order_id=work_order_id, workspace=workspace
            )
        except Exception as exc:
            raise RequestError(
                error_code(exc, default="session_open_failed"),
                f"cannot open a session of package {package_id!r}: {exc}",
                package_id=package_id,
            ) from exc
        try:
            record = await self._deps.store.open_session(
                NewSession(
                    session_id=session.session_id,
                    package_id=package_id,
                    tier=tier,
                    work_order_id=work_order_id,
                    workspace=workspace,
                    tenant=tenant,
                    priority=priority,
                )
            )
        except BaseException:
            session.close()
            raise
        self._deps.sessions.add(session, record)
        if self._fleet is not None:
            await self._fleet.home_opened(session)
        self._log.info(
            "session_opened", session_id=record.session_id, package_id=package_id, tier=tier
        )
        return record

    async def close_session(self, session_id: str) -> SessionRecord:
        await self.get_session(session_id)
        busy = self._deps.tracker.in_session(session_id)
        if not busy and self._fleet is not None:  # its turns may be on another daemon
            busy = await self._fleet.unfinished(session_id)
        if busy or self._gate.submitting(session_id):
            what = f"unfinished turns {busy}" if busy else "a turn being submitted"
            raise RequestError(
                "session_busy",
                f"session {session_id} still has {what}; wait for or cancel them",
                turn_ids=busy,
            )
        self._gate.closing.add(session_id)
        try:
            record = await self._deps.store.close_session(session_id)
        finally:
            self._gate.closing.discard(session_id)
        await self._deps.sessions.close(session_id)
        if self._fleet is not None:
            await self._fleet.closed(session_id)
        self._log.info("session_closed", session_id=session_id)
        return record

    async def list_sessions(self) -> list[SessionRecord]:
        return await self._deps.store.list_sessions()

    async def get_session(self, session_id: str) -> SessionRecord:
        try:
            return await self._deps.store.get_session(session_id)
        except UnknownSessionError:
            raise RequestError(
                "unknown_session",
                f"no session {session_id!r}; list sessions with `hunter session list`",
                session_id=session_id,
            ) from None

    # -- turns ------------------------------------------------------------------------------

    async def submit(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        """Validate, admit and durably accept a turn; returns ``(turn, created)``.

        ``created`` is False when the request's idempotency key already names a turn of the
        session: that first turn comes back if the request asks for the same turn, else
        ``idempotency_conflict`` is raised (`requests.idempotency_conflict`). This holds
        whichever way the first turn is found: by the look-up below, or by the store's accept
        when a submission with the same key was accepted meanwhile (the unique key), here or
        by another daemon of a fleet."""
        turn, created = await self._submit(request)
        if not created:
            conflict = idempotency_conflict(request, turn)
            if conflict is not None:
                raise conflict
        return turn, created

    async def _submit(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        if self._deps.draining:
            raise RequestError(
                "draining", "the daemon is draining and accepts no new turns; retry after restart"
            )
        store = self._deps.store
        sid = request.session_id
        if request.idempotency_key is not None:
            existing = await store.find_turn(sid, request.idempotency_key)
            if existing is not None:
                return existing, False
        admitting = _COSTS.clock()
        session = self._deps.sessions.get(sid)
        if session is None and self._fleet is not None and sid not in self._gate.closing:
            try:
                return await self._fleet.accept_elsewhere(request)
            except SessionClosedError:
                raise RequestError(
                    "session_closed", f"session {sid} is closed; open a new one", session_id=sid
                ) from None
        if session is None or sid in self._gate.closing:
            record = await self.get_session(sid)
            if record.state is not SessionState.OPEN or sid in self._gate.closing:
                raise RequestError(
                    "session_closed", f"session {sid} is closed; open a new one", session_id=sid
                )
            raise RequestError(
                "session_unavailable",
                f"session {sid} is not loaded in this daemon",
                session_id=sid,
            )
        if request.instruction is not None:
            self._admit(request)
        self._gate.enter(sid)
        try:
            if request.process is not None:
                await self._check_process(session, request)
            else:
                _COSTS.add("admit", _COSTS.clock() - admitting, 0)
            try:
                accepted = await store.accept(
                    NewTurn(
                        session_id=sid,
                        spec=request.spec,
                        idempotency_key=request.idempotency_key,
                    ),
                    claim_for=self._deps.owner,
                    lease_ms=self.settings.lease_ms,
                )
            except SessionClosedError:
                raise RequestError(
                    "session_closed", f"session {sid} is closed; open a new one", session_id=sid
                ) from None
            if accepted.created:
                self._deps.tracker.accepted(accepted.turn)  # before its first attempt starts
            if accepted.created and accepted.claim is not None:
                self._runner.start(accepted.turn, accepted.claim, recovered=False)
        finally:
            self._gate.leave(sid)
        turn = accepted.turn
        if accepted.created and info_enabled():
            self._log.info(
                "turn_accepted",
                session_id=sid,
                turn_number=turn.turn_number,
                turn_id=turn.turn_id,
                kind=turn.kind.value,
            )
        return turn, accepted.created

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

    def _admit(self, request: TurnRequest) -> None:
        assert request.instruction is not None
        command_type = request.instruction.command_type
        try:
            self._hub.admit(command_type, waiting=self._runner.parked(command_type))
        except QueueFullError as exc:
            raise RequestError(
                "queue_full",
                f"the {command_type.value} queue is full; retry in {exc.retry_after_ms} ms",
                retry_after_ms=exc.retry_after_ms,
                command_type=command_type.value,
            ) from None

    async def _check_process(self, session: SessionLike, request: TurnRequest) -> None:
        """Capability check at intake (a violation is written to the evidence ledger, durably,
        so it runs on a worker thread)."""
        assert request.process is not None
        spec = request.process
        outputs = [d.to_dict() for d in spec.declared_outputs]
        try:
            await anyio.to_thread.run_sync(session.check_turn_request, list(spec.argv), outputs)
        except Exception as exc:
            code = error_code(exc, default="turn_rejected")
            if code == "capability_violation":
                self._deps.tracker.intake_refused(str(getattr(exc, "capability", "")))
            if self._deps.anchors is not None:  # the violation entry reaches the store first
                await self._deps.anchors.anchor(session)
            raise RequestError(code, str(exc), session_id=request.session_id) from exc

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
        turn = await self.get_turn(turn_id)
        if turn.final:
            return turn
        active = self._deps.tracker.get(turn_id)
        if decision is not None and (active is not None or turn.state is TurnState.ESCALATED):
            self._log.info(
                "turn_cancel_requested",
                turn_id=turn_id,
                state=turn.state.value,
                uid=decision.uid,
                pid=decision.pid,
                operator=decision.operator,
                reason=decision.reason,
            )
        if active is None:
            if turn.state is TurnState.ESCALATED:
                return await self._resolve(turn, Resolution.CANCEL, decision)
            raise RequestError("not_cancellable", f"turn {turn_id} is not active", turn_id=turn_id)
        if decision is not None and active.decided_by is None:  # the first cancel's is kept
            active.decided_by = decision
        if self._runner.unpark(turn_id):  # no task: end it here
            try:
                await self._runner.end_cancelled(turn, active)
            finally:
                self._deps.tracker.remove(active)
            return await self.get_turn(turn_id)
        active.cancel_requested = True
        active.interrupt()
        await active.wait_finished()
        return await self.get_turn(turn_id)

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

    async def verify_ledgers(self, *, session_id: str | None = None) -> dict[str, object]:
        """Verify the exec and evidence ledgers of one session (or of every session). In a
        fleet, only those of the sessions this daemon homes (or no daemon does, when their
        files are here): the others are listed as checked on their home (`verify_ledgers`)."""
        if session_id is not None:
            records = [await self.get_session(session_id)]
        else:
            records = await self.list_sessions()
        homes = None
        if self._fleet is not None:
            wanted = None if session_id is None else [session_id]
            homes = await self._fleet.store.session_homes(wanted)
        self._deps.sessions.write_pending()
        report = await verify_ledgers(
            self.settings.root, records, homes=homes, owner=self._deps.owner
        )
        ledgers, failures = report["ledgers"], report["failures"]
        if isinstance(ledgers, list) and isinstance(failures, list):
            self._deps.tracker.ledgers_verified(ledgers=len(ledgers), failures=len(failures))
        return report

    # -- escalations ------------------------------------------------------------------------

    async def list_escalations(self, *, after_turn_id: int = 0, limit: int = 500) -> TurnPage:
        """A page of the turns parked for an operator, by turn id."""
        return await self._escalations.list(after_turn_id=after_turn_id, limit=limit)

    async def resolve_escalation(
        self, turn_id: int, action: str, decision: Decision | None = None
    ) -> TurnRecord:
        """An operator's decision for a parked turn: ``retry`` or ``terminate``; *decision*:
        who took it and why (recorded as ``decided_by``, `supervisor.turns.decisions`)."""
        if action not in {"retry", "terminate"}:
            raise RequestError(
                "bad_request", "action: must be 'retry' or 'terminate'", field="action"
            )
        turn = await self.get_turn(turn_id)
        return await self._resolve(turn, Resolution(action), decision)

    async def _resolve(
        self, turn: TurnRecord, resolution: Resolution, decision: Decision | None = None
    ) -> TurnRecord:
        """Here, or (in a fleet, an ending of a session homed elsewhere) by asking the home,
        which writes the ending's ledger entries; waits up to 10 s for it."""
        fleet = self._fleet
        if (
            fleet is None
            or resolution is Resolution.RETRY
            or fleet.is_home(turn.session_id)
            or turn.state is not TurnState.ESCALATED
        ):
            resolved = await self._escalations.resolve(turn, resolution, decision)
            self._deps.sessions.write_pending()
            return resolved
        return await fleet.ask_home(turn, resolution, self.get_turn, decision)
