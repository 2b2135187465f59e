"""The submit path with a task: a turn checked, admitted and durably accepted, then started.

`TurnCore.submit` serves a submission in the caller's task, with every check a turn may need:
the drain, an idempotency key already naming a turn, a session homed by another daemon of a
fleet (accepted there unclaimed, `elsewhere.Elsewhere`), a closed or unloaded session, the
queue's backpressure (`admit`, which the task-less intake pass uses too), and a process
turn's capabilities, checked on a worker thread since a violation is written to the evidence
ledger. The accept claims the turn at once (no polling on the hot path) and the runner starts
it. The session gate (`intake.SessionGate`) is held meanwhile, so no close overtakes it.

It is apart from the front (`core.TurnCore`), which keeps the idempotency conflict check and
the waits, and from `intake.Intake`, the task-less pass for the common case.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio.to_thread

from sandbox.errors import CapabilityViolation
from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.errors import QueueFullError, RequestError, SessionClosedError
from supervisor.logging import get_logger, info_enabled
from supervisor.stages import stage_costs
from supervisor.store.protocol import Claim, NewTurn, SessionRecord, SessionState, TurnRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.fleet import Fleet
from supervisor.turns.instruction import HubLike
from supervisor.turns.intake import SessionGate
from supervisor.turns.requests import TurnRequest
from supervisor.turns.runner import error_code
from supervisor.turns.sessions import SessionLike

__all__ = ["Acceptance", "TurnStarter"]

_COSTS = stage_costs()


class TurnStarter(Protocol):
    """What the submit path needs of the turn runner (`runner.TurnRunner`)."""

    def start(self, turn: TurnRecord, claim: Claim, *, recovered: bool = False) -> None: ...

    def parked(self, command: ExecutorCommandType) -> int: ...


class Acceptance:
    """Checks, admits and durably accepts a submitted turn, and starts it."""

    def __init__(
        self,
        deps: TurnDeps,
        gate: SessionGate,
        hub: HubLike,
        runner: TurnStarter,
        *,
        get_session: Callable[[str], Awaitable[SessionRecord]],
        fleet: Fleet | None = None,
    ) -> None:
        self._deps = deps
        self._gate = gate
        self._hub = hub
        self._runner = runner
        #: the session's record, or ``unknown_session`` (`session_desk.SessionDesk.get`)
        self._get_session = get_session
        self._fleet = fleet
        self._log = get_logger("supervisor.turns")

    async def accept(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        """Validate, admit and durably accept *request*; returns ``(turn, created)``, with the
        turn its idempotency key already names when not created (the caller checks that it
        is the same turn asked for)."""
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
            record = await self._get_session(sid)
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
            self.admit(request)
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
                    lease_ms=self._deps.settings.lease_ms,
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

    def admit(self, request: TurnRequest) -> None:
        """The queue's backpressure for an instruction turn: ``queue_full`` when its command
        type's queue, with the turns parked here, is full."""
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
        """Capability check at intake, on the loop (a few ``stat`` calls: a worker thread's
        hand-offs cost more); a violation is then written to the evidence ledger, durably,
        on a worker thread, before the refusal is answered."""
        assert request.process is not None
        spec = request.process
        outputs = [d.to_dict() for d in spec.declared_outputs]
        try:
            try:
                session.check_turn_request(list(spec.argv), outputs, record=False)
            except CapabilityViolation as violation:
                await anyio.to_thread.run_sync(session.record_refused_request, violation)
                raise
        except Exception as exc:
            code = error_code(exc, default="turn_rejected")
            if code == "capability_violation":
                self._deps.tracker.intake_refused(str(getattr(exc, "capability", "")))
            if self._deps.anchors is not None:  # the violation entry reaches the store first
                await self._deps.anchors.anchor(session)
            raise RequestError(code, str(exc), session_id=request.session_id) from exc
