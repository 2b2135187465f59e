"""Running turns: instruction turns as records (`flights`) on their hot path, else a task per
started turn; parked turns (no task) until an executor slot frees; and the daemon's own
endings of a turn (a cancel, an error).

`TurnRunner` belongs to `TurnCore` (the front), which lends it the neighbours (`TurnDeps`, the
hub) and the task group of its `run`. Each turn kind supplies its attempts
(`instruction.run_instruction_turn`, `process.run_process_turn`); the runner only decides when
a turn starts and what happens when its run fails or is cancelled.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import anyio
import anyio.abc
import structlog.contextvars

from ledger.errors import LedgerClosedError
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import ClaimLostError, LedgerForkError, StaleClaimError
from supervisor.logging import get_logger
from supervisor.store.fleet import StaleHomeError
from supervisor.store.protocol import Claim, TurnEnding, TurnRecord
from supervisor.turns.context import TurnDeps, end_turn, now_us
from supervisor.turns.flights import DispatchingHub, InstructionFlights
from supervisor.turns.instruction import (
    HubAttemptLike,
    HubLike,
    run_instruction_turn,
    slot_wait_s,
)
from supervisor.turns.parking import Parked, ParkedTurns
from supervisor.turns.process import run_process_turn
from supervisor.turns.slot_deadlines import SlotDeadlines
from supervisor.turns.tracker import ActiveTurn
from supervisor.wire.turn_spec import InstructionSpec

__all__ = ["INTERRUPTED_BY_RESTART", "TurnRunner", "error_code"]

#: The detail of an attempt that was running when this daemon stopped (alone on its store).
INTERRUPTED_BY_RESTART = "interrupted by a restart of this daemon: it stopped while the attempt ran"


def error_code(exc: BaseException, *, default: str) -> str:
    """The control API's code for an error raised by the sandbox runtime."""
    table = {
        "PackageNotFoundError": "unknown_package",
        "ManifestError": "bad_manifest",
        "DeclarationError": "declaration_error",
        "CapabilityViolation": "capability_violation",
        "SandboxUnavailableError": "sandbox_unavailable",
    }
    return table.get(type(exc).__name__, default)


class _Launch:
    """A started instruction turn counts as launching until its first envelope reaches the hub
    (the hub then counts the slot itself)."""

    __slots__ = ("_command", "_counter")

    def __init__(
        self,
        counter: collections.Counter[ExecutorCommandType],
        command: ExecutorCommandType | None,
    ) -> None:
        self._counter = counter
        self._command = command

    def done(self) -> None:
        if self._command is not None:
            self._counter[self._command] -= 1
            self._command = None


class _SlotReturns:
    """The hub as a turn's attempts see it: when an attempt gives its executor slot back, the
    feeder looks at once, so a parked turn (another tenant's too) takes the slot then, not when
    the finished turn's ending is committed (under load, tens of milliseconds later)."""

    __slots__ = ("_hub", "_returned")

    def __init__(self, hub: HubLike, returned: Callable[[], None]) -> None:
        self._hub = hub
        self._returned = returned

    def admit(self, command_type: ExecutorCommandType, *, waiting: int = 0) -> None:
        self._hub.admit(command_type, waiting=waiting)

    def free_slots(self, command_type: ExecutorCommandType) -> int:
        return self._hub.free_slots(command_type)

    def serving(self, command_type: ExecutorCommandType) -> int:
        return self._hub.serving(command_type)

    @property
    def queue_wait_s(self) -> float:
        return self._hub.queue_wait_s

    async def run_attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        *,
        queue_wait_s: float | None = None,
        queued_before_ms: int = 0,
        traceparent: str | None = None,
    ) -> HubAttemptLike:
        try:
            return await self._hub.run_attempt(
                envelope,
                queue_wait_s=queue_wait_s,
                queued_before_ms=queued_before_ms,
                traceparent=traceparent,
            )
        finally:
            self._returned()


class TurnRunner:
    """Starts turns (or parks them), runs each in its own task, ends the ones that fail."""

    def __init__(self, deps: TurnDeps, hub: HubLike) -> None:
        self._deps = deps
        self._hub = hub
        self._log = get_logger("supervisor.turns")
        self._tg: anyio.abc.TaskGroup | None = None
        # Instruction turns waiting for an executor slot, without a task (see `parking`), and
        # per command type the turns started whose envelope is not yet with the hub.
        self._parked = ParkedTurns()
        self._due = SlotDeadlines()  # each parked turn's own bound (its timeout_ms)
        self._launching: collections.Counter[ExecutorCommandType] = collections.Counter()
        self._feed: anyio.Event | None = None
        #: recovered turns another daemon ran before (`start`'s *taken_over*), until started
        self._taken_over: set[int] = set()
        self._attempts_hub = _SlotReturns(hub, self._kick_feeder)
        # Instruction turns without a task on their hot path, when the hub takes attempts so.
        self._flights = (
            InstructionFlights(deps, hub, self) if isinstance(hub, DispatchingHub) else None
        )
        #: in a fleet: True for a command type no executor here serves but another live
        #: daemon's do (`Fleet.peer_only`); its parked turns wait for a hand-over
        self.served_elsewhere: Callable[[ExecutorCommandType], bool] = lambda _command: False

    async def run_flights(self) -> None:
        """The committer of the record-driven instruction turns (in the core's task group)."""
        if self._flights is not None:
            await self._flights.run()

    def attach(self, tg: anyio.abc.TaskGroup | None) -> None:
        """The task group turns run in (None: the core stopped)."""
        self._tg = tg

    def parked(self, command: ExecutorCommandType) -> int:
        return self._parked.count(command)

    def unpark(self, turn_id: int) -> bool:
        """Take a parked turn out (it is ended or lost elsewhere); False if it was not parked."""
        return self._parked.remove(turn_id) is not None

    def is_parked(self, turn_id: int) -> bool:
        return self._parked.command(turn_id) is not None

    def start(
        self, turn: TurnRecord, claim: Claim, *, recovered: bool = False, taken_over: bool = False
    ) -> None:
        """Run *turn* under *claim*: in a task now, or parked until an executor slot frees.
        *recovered*: claimed again after a restart or a takeover; *taken_over*: from another
        daemon (or an earlier run whose session's files are not on this root)."""
        if self._tg is None:
            msg = "the turn core is not running"
            raise RuntimeError(msg)
        if taken_over and turn.state is TurnState.RUNNING:  # never parked: its task forgets it
            self._taken_over.add(turn.turn_id)
        active = self._deps.tracker.add(turn, claim)
        command = self._command(turn)
        if command is not None and turn.state is TurnState.ACCEPTED:
            free = self._hub.free_slots(command) - self._launching[command]
            if self._parked.count(command) or free <= 0:  # FIFO: never overtake parked turns
                now = time.monotonic()
                share = self._deps.sessions.share(turn.session_id)  # fair order (`fairness`)
                self._parked.park(command, turn, claim, now, share)
                assert isinstance(turn.spec, InstructionSpec)
                bound_s = slot_wait_s(self._hub, turn.spec)
                self._due.add(turn.turn_id, now + bound_s)
                return
        self._launch(turn, active, recovered, command)

    def _command(self, turn: TurnRecord) -> ExecutorCommandType | None:
        spec = turn.spec
        return spec.command_type if isinstance(spec, InstructionSpec) else None

    def _launch(
        self,
        turn: TurnRecord,
        active: ActiveTurn,
        recovered: bool,
        command: ExecutorCommandType | None,
        parked_s: float = 0.0,
    ) -> None:
        assert self._tg is not None
        spec = turn.spec
        if (
            self._flights is not None
            and not recovered
            and isinstance(spec, InstructionSpec)
            and turn.state is TurnState.ACCEPTED
            and self._flights.launch(turn, active, spec)
        ):
            return
        if command is not None:
            self._launching[command] += 1
        self._tg.start_soon(
            self._turn_task,
            turn,
            active,
            recovered,
            command,
            parked_s,
            name=f"turn-{turn.turn_id}",
        )

    def _unpark(self, parked: Parked) -> None:
        active = self._deps.tracker.get(parked.turn.turn_id)
        if active is None or active.claim is None:  # ended or lost while parked
            return
        parked_s = time.monotonic() - parked.parked_at
        self._launch(parked.turn, active, False, self._command(parked.turn), parked_s)

    def _kick_feeder(self) -> None:
        if self._feed is not None and len(self._parked):
            self._feed.set()

    async def feed_parked(self) -> None:
        """Start parked turns as executor slots free up, in fair order across tenants (woken
        when a turn of this daemon ends, and every 50 ms for executors that connect or become
        ready)."""
        while True:
            self._feed = anyio.Event()
            with anyio.move_on_after(0.05):
                await self._feed.wait()
            self._feed = None
            if not len(self._parked) or self._deps.draining or self._tg is None:
                continue
            for command in self._parked.commands():
                free = self._hub.free_slots(command) - self._launching[command]
                for parked in self._parked.pop(command, max(0, free)):
                    self._unpark(parked)
            # In a fleet, the turns of a command type only another daemon serves wait for
            # their session to be handed over there (`fleet`), not for the NO_CAPABLE_EXECUTOR
            # their bound would give them here.
            keep = frozenset(c for c in self._parked.commands() if self.served_elsewhere(c))
            overdue = self._parked.overdue(
                now=time.monotonic(), max_wait_s=self._hub.queue_wait_s, keep=keep
            )
            for turn_id in self._due.due(time.monotonic()):  # past their own timeout_ms
                if self._parked.command(turn_id) in keep:
                    continue
                due = self._parked.remove(turn_id)
                if due is not None:
                    overdue.append(due)
            if not len(self._parked):
                self._due.clear()
            for parked in overdue:  # they meet the hub's "no slot" / "no capable executor" end
                self._unpark(parked)

    # -- what flights hand back (`flights.FlightOwner`) ----------------------------------------

    def slot_returned(self) -> None:
        self._kick_feeder()

    def released(self, active: ActiveTurn) -> None:
        self._deps.tracker.remove(active)
        self._kick_feeder()

    def run_later(self, turn: TurnRecord, active: ActiveTurn) -> None:
        if self._tg is None:
            self.released(active)
            return
        self._launch(turn, active, False, self._command(turn))

    def end_cancelled_later(self, turn: TurnRecord, active: ActiveTurn) -> None:
        self._kick_feeder()
        self._later(turn, active, lambda: self.end_cancelled(turn, active))

    def end_failed_later(self, turn: TurnRecord, active: ActiveTurn, exc: Exception) -> None:
        self._later(turn, active, lambda: self._end_error(turn, active, exc))

    def _later(
        self, turn: TurnRecord, active: ActiveTurn, step: Callable[[], Awaitable[None]]
    ) -> None:
        if self._tg is None:
            self.released(active)
            return
        self._tg.start_soon(self._ending_task, turn, active, step, name=f"turn-{turn.turn_id}")

    async def _ending_task(
        self, turn: TurnRecord, active: ActiveTurn, step: Callable[[], Awaitable[None]]
    ) -> None:
        structlog.contextvars.bind_contextvars(
            session_id=turn.session_id, turn_number=turn.turn_number, turn_id=turn.turn_id
        )
        try:
            await step()
        except (StaleClaimError, StaleHomeError, LedgerForkError, LedgerClosedError) as exc:
            self._log.warning("stale_result_refused", reason=str(exc))
            if isinstance(exc, (StaleHomeError, LedgerForkError)):
                self._deps.stale_session(turn.session_id)
        except Exception as exc:  # the store or a ledger itself is broken: log, keep serving
            self._log.exception("turn_finish_failed", error=str(exc))
        finally:
            self.released(active)

    async def _turn_task(
        self,
        turn: TurnRecord,
        active: ActiveTurn,
        recovered: bool,
        command: ExecutorCommandType | None,
        parked_s: float = 0.0,
    ) -> None:
        # Each task runs in its own copy of the context: the ids bound here label every event
        # of this turn (the hub's too) and vanish with the task.
        structlog.contextvars.bind_contextvars(
            session_id=turn.session_id, turn_number=turn.turn_number, turn_id=turn.turn_id
        )
        launched = _Launch(self._launching, command)
        interrupted: AttemptRecord | None = None
        if recovered and turn.state is TurnState.RUNNING and turn.attempt >= 1:
            prior = next((a for a in turn.attempts if a.attempt == turn.attempt), None)
            cause, detail = self._interruption(turn.turn_id in self._taken_over)
            interrupted = replace(
                prior or AttemptRecord(attempt=turn.attempt, started_us=now_us()),
                detail=detail,
            )
            self._log.info("attempt_interrupted", attempt=turn.attempt, cause=cause)
        try:
            with anyio.CancelScope() as scope:
                active.scope = scope
                if active.cancel_requested:  # asked between the hand-over and this task's start
                    scope.cancel()
                spec = turn.spec
                if isinstance(spec, InstructionSpec):
                    await run_instruction_turn(
                        self._deps,
                        self._attempts_hub,
                        turn,
                        active,
                        spec,
                        interrupted=interrupted,
                        dispatched=launched.done,
                        queue_waited_s=parked_s,
                    )
                else:
                    await run_process_turn(self._deps, turn, active, spec, interrupted=interrupted)
            active.scope = None
            if active.cancel_requested and active.claim is not None:
                await self.end_cancelled(turn, active)
        except ClaimLostError as exc:  # this daemon lost the claim (a pause past its lease)
            self._log.warning("stale_result_refused", reason=exc.reason)
        except LedgerClosedError:  # the session was dropped here meanwhile (its home moved)
            self._log.warning("stale_result_refused", reason="its session was unloaded here")
        except StaleClaimError as exc:
            self._log.warning(
                "stale_result_refused", token=exc.token, current_token=exc.current_token
            )
        except (StaleHomeError, LedgerForkError) as exc:  # in a fleet: it went on elsewhere
            self._log.warning("stale_result_refused", reason=str(exc))
            self._deps.stale_session(turn.session_id)
        except Exception as exc:  # a bug or a broken dependency ends this turn, not the daemon
            self._log.exception("turn_failed", error_type=type(exc).__name__, error=str(exc))
            await self._end_error(turn, active, exc)
        finally:
            self._taken_over.discard(turn.turn_id)
            launched.done()
            self._deps.tracker.remove(active)
            self._kick_feeder()

    def _interruption(self, taken_over: bool) -> tuple[str, str]:
        """Why an attempt found running when this daemon claimed its turn did not finish, as
        the log's ``cause`` and the attempt's detail. Alone on its store, this daemon claims
        such a turn only when it starts again on the same root (`lifetime.Lifetime._recover`): the
        attempt ran when it stopped. In a fleet (`fleet`), it claims one when the claim of the
        daemon running it lapsed: a restart when that was this root's own earlier run (the
        session came back here with its files), else a takeover from another daemon."""
        deps = self._deps
        if deps.anchors is None or not taken_over:
            return "restart", INTERRUPTED_BY_RESTART
        return "takeover", (
            "interrupted by a takeover: the daemon running it stopped renewing its claim (lease"
            f" {deps.settings.lease_ms} ms), and daemon {deps.owner} took the turn over"
        )

    async def _end(self, turn: TurnRecord, active: ActiveTurn, ending: TurnEnding) -> TurnRecord:
        """End a turn on the daemon's own decision (cancel, an error), unless it already ended."""
        current = await self._deps.store.get_turn(turn.turn_id)
        if current.final:
            return current  # it ended before the cancellation reached it
        return await end_turn(self._deps, current, active, ending)

    async def end_cancelled(self, turn: TurnRecord, active: ActiveTurn) -> None:
        # who asked, and why: in the result and the evidence entry (`decisions`)
        decided = active.decided_by
        with anyio.CancelScope(shield=True):
            await self._end(
                turn,
                active,
                TurnEnding(
                    state=TurnState.CANCELLED,
                    reason_code="CANCELLED_BY_CLIENT",
                    reason="cancelled through the control API",
                    result={} if decided is None else {"decided_by": decided.to_dict()},
                ),
            )

    async def _end_error(self, turn: TurnRecord, active: ActiveTurn, exc: Exception) -> None:
        """End a turn whose run raised: `rejected` when the sandbox refused it, else
        `terminated` with INTERNAL_ERROR; the ledgers still get the turn's entries."""
        if active.claim is None:
            return
        code = error_code(exc, default="internal")
        state = TurnState.REJECTED if code != "internal" else TurnState.TERMINATED
        try:
            with anyio.CancelScope(shield=True):
                await self._end(
                    turn,
                    active,
                    TurnEnding(
                        state=state,
                        verdict="TERMINATE",
                        reason_code="INTERNAL_ERROR" if code == "internal" else code.upper(),
                        reason=f"{type(exc).__name__}: {exc}",
                    ),
                )
        except (StaleClaimError, StaleHomeError, LedgerForkError, LedgerClosedError) as again:
            self._log.warning("stale_result_refused", reason=str(again))
            if isinstance(again, (StaleHomeError, LedgerForkError)):
                self._deps.stale_session(turn.session_id)
        except Exception as again:  # the store or a ledger itself is broken: log, keep serving
            self._log.exception("turn_finish_failed", error=str(again))
