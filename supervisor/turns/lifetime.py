"""The turn core's lifetime: the task group every turn runs in, its standing tasks, the drain.

`Lifetime.run` first resumes the open sessions and takes back every unfinished turn
(`store.recover`, or in a fleet the fleet's rounds do it): an attempt that was running is
decided as a CRASH fault (`lifecycle.interrupted_outcome`), a turn waiting for a retry sleeps
the rest of its backoff, an accepted one starts. Then the standing tasks run beside the turns
until cancelled: claim renewal (a claim lost meanwhile cancels that turn here), ledger sync
rounds, the ledger flusher, deferred attempt starts, the parked turns' feed, the instruction
endings' committer and the intake pass. `drain` stops new attempts and waits (up to a grace
deadline) for running ones.

It is apart from the front (`core.TurnCore`): it changes when the daemon's standing work does,
not when the control API does; the front's calls never pass through it on a turn's path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.abc

from sandbox.policy.lifecycle import TurnState
from supervisor.logging import get_logger
from supervisor.store.protocol import Claim, SessionState, TurnEnding, TurnRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.fleet import Fleet
from supervisor.turns.leases import renew_claims
from supervisor.turns.recovery import catch_up_ledgers, roll_forward
from supervisor.turns.tracker import ActiveTurn

__all__ = ["Lifetime", "TurnTasks"]


class TurnTasks(Protocol):
    """What the lifetime needs of the turn runner (`runner.TurnRunner`)."""

    def attach(self, tg: anyio.abc.TaskGroup | None) -> None: ...

    def start(self, turn: TurnRecord, claim: Claim, *, recovered: bool = False) -> None: ...

    def unpark(self, turn_id: int) -> bool: ...

    async def feed_parked(self) -> None: ...

    async def run_flights(self) -> None: ...


class Lifetime:
    """Runs the turn core's task group: restart recovery, standing tasks, drain."""

    def __init__(
        self,
        deps: TurnDeps,
        runner: TurnTasks,
        *,
        intake: Callable[[], Coroutine[Any, Any, None]],
        fleet: Fleet | None = None,
    ) -> None:
        self._deps = deps
        self._runner = runner
        #: the intake pass (`intake.Intake.run`): submissions are taken while it runs
        self._intake = intake
        self._fleet = fleet
        self._log = get_logger("supervisor.turns")

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Resume sessions and unfinished turns, then run turns until cancelled."""
        deps = self._deps
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
                        deps.store,
                        deps.tracker,
                        deps.leases,
                        lease_ms=lambda: deps.settings.lease_ms,
                        owner=deps.owner,
                        lost=self._claim_lost,
                        lapsed=self._lapsed,
                    ),
                    name="lease-renewal",
                )
                tg.start_soon(self._sync_ledgers, name="ledger-sync")
                tg.start_soon(deps.sessions.run_flusher, name="ledger-flush")
                tg.start_soon(deps.starts.run, name="attempt-starts")
                tg.start_soon(self._runner.feed_parked, name="parked-turns")
                tg.start_soon(self._runner.run_flights, name="instruction-endings")
                tg.start_soon(self._intake, name="instruction-intake")
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._runner.attach(None)
            deps.sessions.close_all()

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

    async def _recover(self) -> None:
        store = self._deps.store
        sessions = self._deps.sessions
        for record in await store.list_sessions(state=SessionState.OPEN):
            if await sessions.resume(record):
                session = sessions.get(record.session_id)
                assert session is not None
                await catch_up_ledgers(store, sessions, session)
        claims = await store.recover(self._deps.owner, lease_ms=self._deps.settings.lease_ms)
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

    async def _lapsed(self, late_s: float) -> None:
        """The leases' account ran out (a pause): the fleet reads its homes first."""
        if self._fleet is not None:
            await self._fleet.lapsed(late_s)

    async def _sync_ledgers(self) -> None:
        """Sync the ledger files in rounds and trim the lines the store kept for them (a
        turn's lines are durable in the store from its ending's commit on)."""
        interval = max(0.01, self._deps.settings.ledger_sync_interval_s)
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
