"""The scheduler: runs accepted turns through the attempt policy and writes their ledger entries.

Design notes
------------
* **Ownership.** `Scheduler.run` owns one task group; every turn runs as one task in it (no
  fire-and-forget). A turn task is wrapped in its own cancel scope so `cancel_turn` can stop just
  that turn.
* **Instruction turns.** Each attempt builds a fresh `ExecutorInstructionEnvelope` (instruction id
  ``INS-<turn>-<attempt>``, execution id ``EXE-<turn>``) and hands it to the hub (which queues it
  for a READY executor, enforces the deadline and maps the response to an `AttemptOutcome`);
  the intake row moves to ``running`` in a commit that overlaps the dispatch and the ledger
  writes (one fsync less on the turn's path) and is durable before the outcome is recorded in
  the intake. Then `decide_attempt` says what
  next: RETRY sleeps the backoff in this task (a retry may go to another executor),
  SUCCEED/TERMINATE/EXHAUSTED end the turn, ESCALATE parks it until an operator resolves it.
  A crash before the ``running`` commit leaves the turn ``accepted``/``waiting_retry``; the
  restart then simply runs that attempt again (executors see at-least-once delivery either way).
* **Idempotent submission** happens before admission: a resubmitted key returns its turn even
  when the queue is full.
* **Process turns** go to `Session.run_process_turn`, which runs its own attempts through the same
  policy (and writes its own ledger entries), so the scheduler does not retry them again. Process
  turns of one session run one at a time (they share the session's sandbox directories); across
  sessions at most ``process_slots`` run at once.
* **Ledgers.** Every turn that ends (or is parked) gets its exec and evidence entries; instruction
  turns via `Session.record_instruction_turn` with one external call per attempt. The ledger
  entries are written before the intake's final state: a crash in between re-runs the attempt
  after the restart (the ledger then holds both entries); a turn never ends without its entries.
  An escalated turn gets entries when it is parked and again when the operator resolves it.
* **Drain.** `drain` stops new attempts from starting and waits (up to a grace deadline) for the
  attempts in progress. Whatever is still running when the daemon then cancels everything stays
  ``running`` in the intake, and the next start treats it as an interrupted attempt: a CRASH fault
  that follows the policy. Turns waiting for a retry stay ``waiting_retry`` and resume on restart.
* **Restart.** `run` first picks up the intake's unfinished turns: ``running`` ones become a CRASH
  of their current attempt, ``waiting_retry`` ones sleep whatever is left of their backoff,
  ``accepted`` ones start, ``escalated`` ones stay parked.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.to_thread
import structlog.contextvars

from sandbox.policy.attempts import (
    AttemptDecision,
    AttemptOutcome,
    OutcomeKind,
    Verdict,
    decide_attempt,
)
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope, deep_thaw
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.retry_protocol import AgentPhase, RetryOptions
from sandbox.policy.safety import build_executor_instruction, instruction_to_wire
from supervisor.errors import QueueFullError, RequestError
from supervisor.logging import bind_ids, get_logger
from supervisor.store.sqlite.intake import (
    AttemptRow,
    CommitterStatistics,
    Intake,
    IntakeCommitter,
    Pending,
    SessionRow,
    SessionState,
    TurnKind,
    TurnRow,
    TurnState,
    UnknownSessionError,
    UnknownTurnError,
    now_us,
)
from supervisor.turns.requests import (
    DeclaredOutput,
    TurnRequest,
    iso_now,
    parse_turn_request,
)

__all__ = [
    "HubLike",
    "RuntimeLike",
    "Scheduler",
    "SchedulerSettings",
    "SchedulerStatistics",
    "SessionLike",
]

_RECENT_TURNS = 4096


# --------------------------------------------------------------------------------------------
# Plug points (Protocols, so tests can inject fakes)


class AttemptReportLike(Protocol):
    @property
    def outcome(self) -> AttemptOutcome: ...
    @property
    def executor_id(self) -> str | None: ...
    @property
    def response(self) -> Any: ...
    @property
    def safety_reason_code(self) -> str: ...
    @property
    def duration_ms(self) -> int: ...
    @property
    def detail(self) -> str: ...


class HubLike(Protocol):
    """What the scheduler needs from the executor hub."""

    def admit(self, command_type: ExecutorCommandType) -> None:
        """Raise `QueueFullError` when the command type's queue is full."""

    async def run_attempt(self, envelope: ExecutorInstructionEnvelope) -> AttemptReportLike: ...


class SessionLike(Protocol):
    """What the scheduler needs from a sandbox runtime session (`sandbox.runtime.Session`)."""

    @property
    def session_id(self) -> str: ...

    def check_turn_request(
        self, argv: Sequence[str], declared_outputs: object, *, turn_number: int | None = None
    ) -> None: ...

    async def run_process_turn(
        self,
        argv: Sequence[str],
        *,
        declared_outputs: object,
        declared_inputs: Sequence[str] = (),
        phase: AgentPhase | None = None,
        timeout_ms: int | None = None,
        turn_number: int | None = None,
        options: RetryOptions | None = None,
    ) -> Any: ...

    async def record_instruction_turn(
        self,
        *,
        turn_number: int,
        instruction: Mapping[str, object],
        result: Mapping[str, object],
        status: str,
        external_calls: Iterable[object] = (),
    ) -> Any: ...

    def close(self) -> None: ...


class RuntimeLike(Protocol):
    """What the scheduler needs from the sandbox runtime (`sandbox.runtime.session.Runtime`)."""

    def open_session(
        self,
        package_id: str,
        *,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: Path | None = None,
    ) -> SessionLike: ...

    def resume_session(
        self,
        session_id: str,
        *,
        tier: str = "default",
        package_id: str | None = None,
        workspace: Path | None = None,
        work_order_id: str | None = None,
    ) -> SessionLike: ...


# --------------------------------------------------------------------------------------------
# Scheduler


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    root: Path = Path(".hunter")
    retry: RetryOptions = field(default_factory=RetryOptions)
    process_slots: int = 4
    default_timeout_ms: int = 30_000
    wait_limit_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    sessions_open: int
    turns_active: int
    attempts_running: int
    turns_waiting_retry: int
    turns_escalated: int
    process_turns_running: int
    accepted_total: int
    finished_total: int
    finished_by_state: Mapping[str, int]
    draining: bool

    def to_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["finished_by_state"] = dict(self.finished_by_state)
        return data


@dataclass(slots=True)
class _Active:
    turn_id: int
    session_id: str
    turn_number: int
    kind: TurnKind
    state: TurnState
    attempt: int = 0
    executor_id: str | None = None
    scope: anyio.CancelScope | None = None
    cancel_requested: bool = False
    #: the operator's decision on a parked turn (created by `Scheduler._park`)
    resolved: anyio.Event | None = None
    resolution: str | None = None
    #: true while the turn is final or parked (escalated): `wait_turn` returns
    settled: bool = False
    #: true once the turn's task has ended
    done: bool = False
    # Events only for those who wait (most turns have one waiter, or none): creating an anyio
    # Event per state change per turn showed up in the profile.
    _finished: anyio.Event | None = None
    _changed: anyio.Event | None = None
    _settled: anyio.Event | None = None

    def move(self, state: TurnState) -> None:
        self.state = state
        self.notify()

    def claim_resolution(self, action: str) -> bool:
        """Take the one decision on the parked turn (an operator's, or a cancel); False when
        the turn is not parked or a decision was already taken."""
        if self.resolved is None or self.resolved.is_set() or self.resolution is not None:
            return False
        self.resolution = action
        return True

    def notify(self) -> None:
        """Wake whoever waits for a change of this turn."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def settle(self) -> None:
        """The turn is final or parked: `wait_turn` callers return."""
        self.settled = True
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    async def wait_settled(self) -> None:
        """Wait until `settle` (a waiter that cares for no other state is woken only once)."""
        if self.settled:
            return
        if self._settled is None:
            self._settled = anyio.Event()
        await self._settled.wait()

    def mark_finished(self) -> None:
        self.done = True
        self.settle()
        if self._finished is not None:
            self._finished.set()
        self.notify()

    async def wait_finished(self) -> None:
        if self.done:
            return
        if self._finished is None:
            self._finished = anyio.Event()
        await self._finished.wait()


_OUTCOME_TO_RESPONSE_STATE = {
    OutcomeKind.FAILURE: TurnState.FAILED,
    OutcomeKind.REFUSED: TurnState.TERMINATED,
}


def _final_state(outcome: AttemptOutcome, decision: AttemptDecision) -> TurnState:
    if decision.verdict is Verdict.SUCCEED:
        return TurnState.SUCCEEDED
    if decision.verdict is Verdict.EXHAUSTED:
        return TurnState.EXHAUSTED
    if decision.verdict is Verdict.ESCALATE:
        return TurnState.ESCALATED
    if outcome.kind in _OUTCOME_TO_RESPONSE_STATE:
        return _OUTCOME_TO_RESPONSE_STATE[outcome.kind]
    if outcome.fault_type is ExecutionFaultType.TIMEOUT:
        return TurnState.TIMEOUT
    if outcome.fault_type is ExecutionFaultType.SECURITY_VIOLATION:
        return TurnState.VIOLATION
    return TurnState.TERMINATED


def _process_status_to_state(status: str) -> TurnState:
    try:
        return TurnState(status)
    except ValueError:
        return TurnState.TERMINATED


def _enum_value(value: object) -> str | None:
    if value is None:
        return None
    name = getattr(value, "value", value)
    return str(name)


class Scheduler:
    """Runs turns; the control API calls its public coroutines."""

    def __init__(
        self,
        *,
        committer: IntakeCommitter,
        hub: HubLike,
        runtime: RuntimeLike,
        settings: SchedulerSettings | None = None,
    ) -> None:
        self._committer = committer
        self._intake: Intake = committer.intake
        self._hub = hub
        self._runtime = runtime
        self.settings = settings or SchedulerSettings()
        self._log = get_logger("supervisor.turns.scheduler")
        self._tg: anyio.abc.TaskGroup | None = None
        self._sessions: dict[str, SessionLike] = {}
        self._session_locks: dict[str, anyio.Lock] = {}
        self._active: dict[int, _Active] = {}
        self._process_limiter = anyio.CapacityLimiter(max(1, self.settings.process_slots))
        self._attempts_running = 0
        self._process_running = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._draining = False
        self._accepted_total = 0
        self._finished_total = 0
        self._finished_by_state: dict[str, int] = {}
        self._recent: collections.OrderedDict[int, TurnRow] = collections.OrderedDict()
        self._requests: dict[int, TurnRequest] = {}  # parsed requests of active turns
        # Submissions past their session check but not yet started, per session, and the
        # sessions being closed: `close_session` and `submit` each refuse while the other is
        # under way, so a turn is never accepted into a session closed under it.
        self._submitting: collections.Counter[str] = collections.Counter()
        self._closing: collections.Counter[str] = collections.Counter()

    # -- lifecycle ------------------------------------------------------------------------

    def _spec(self, turn: TurnRow) -> TurnRequest:
        """The turn's parsed request (parsed at submit; parsed again only after a restart)."""
        request = self._requests.get(turn.turn_id)
        if request is None:
            request = parse_turn_request(turn.spec, session_id=turn.session_id)
            self._requests[turn.turn_id] = request
        return request

    @property
    def draining(self) -> bool:
        return self._draining

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Recover unfinished turns, then run turns until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await self._recover()
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            for session in list(self._sessions.values()):
                session.close()
            self._sessions.clear()

    async def _recover(self) -> None:
        sessions = await self._committer.call(
            lambda: self._intake.op_list_sessions(state=SessionState.OPEN)
        )
        for row in sessions:
            try:
                self._sessions[row.session_id] = await anyio.to_thread.run_sync(
                    functools.partial(
                        self._runtime.resume_session,
                        row.session_id,
                        tier=row.tier,
                        package_id=row.package_id,
                        workspace=Path(row.workspace) if row.workspace else None,
                        work_order_id=row.work_order_id,
                    )
                )
            except Exception as exc:  # one broken session must not stop the daemon
                self._log.error("session_resume_failed", session_id=row.session_id, error=str(exc))
        turns = await self._committer.call(self._intake.op_unfinished_turns)
        for turn in turns:
            if turn.session_id not in self._sessions:
                await self._finish_without_session(turn)
                continue
            self._start_turn(turn, recovered=True)
        if turns:
            self._log.info("turns_recovered", count=len(turns))

    async def _finish_without_session(self, turn: TurnRow) -> None:
        await self._committer.call(
            lambda: self._intake.op_set_state(
                turn.turn_id,
                TurnState.TERMINATED,
                reason_code="SESSION_UNAVAILABLE",
                reason="the turn's session could not be resumed after a restart",
            )
        )

    async def drain(self, grace_s: float) -> bool:
        """Stop starting attempts; wait up to *grace_s* for running ones. True when none is left."""
        self._draining = True
        self._log.info("drain_started", attempts_running=self._attempts_running, grace_s=grace_s)
        with anyio.move_on_after(grace_s):
            await self._idle.wait()
        clean = self._attempts_running == 0
        self._log.info("drain_finished", clean=clean, attempts_left=self._attempts_running)
        return clean

    def statistics(self) -> SchedulerStatistics:
        waiting = sum(1 for a in self._active.values() if a.state is TurnState.WAITING_RETRY)
        escalated = sum(1 for a in self._active.values() if a.state is TurnState.ESCALATED)
        return SchedulerStatistics(
            sessions_open=len(self._sessions),
            turns_active=len(self._active),
            attempts_running=self._attempts_running,
            turns_waiting_retry=waiting,
            turns_escalated=escalated,
            process_turns_running=self._process_running,
            accepted_total=self._accepted_total,
            finished_total=self._finished_total,
            finished_by_state=dict(self._finished_by_state),
            draining=self._draining,
        )

    def intake_statistics(self) -> CommitterStatistics:
        """Group-commit counters of the intake (batches, operations, largest batch)."""
        return self._committer.statistics()

    def in_flight(self) -> list[dict[str, object]]:
        return [
            {
                "turn_id": a.turn_id,
                "session_id": a.session_id,
                "turn_number": a.turn_number,
                "kind": a.kind.value,
                "state": a.state.value,
                "attempt": a.attempt,
                "executor_id": a.executor_id,
            }
            for a in sorted(self._active.values(), key=lambda a: a.turn_id)
        ]

    # -- sessions -------------------------------------------------------------------------

    async def open_session(
        self,
        *,
        package_id: str,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: str | None = None,
    ) -> SessionRow:
        if self._draining:
            raise RequestError("draining", "the daemon is draining; open the session after restart")
        try:
            session = await anyio.to_thread.run_sync(
                functools.partial(
                    self._runtime.open_session,
                    package_id,
                    tier=tier,
                    work_order_id=work_order_id,
                    workspace=Path(workspace) if workspace else None,
                )
            )
        except RequestError:
            raise
        except Exception as exc:
            raise RequestError(
                _error_code(exc, default="session_open_failed"),
                f"cannot open a session of package {package_id!r}: {exc}",
                package_id=package_id,
            ) from exc
        try:
            row = await self._committer.call(
                lambda: self._intake.op_open_session(
                    session_id=session.session_id,
                    package_id=package_id,
                    tier=tier,
                    work_order_id=work_order_id,
                    workspace=workspace,
                )
            )
        except BaseException:
            session.close()
            raise
        self._sessions[row.session_id] = session
        with bind_ids(session_id=row.session_id):
            self._log.info("session_opened", package_id=package_id, tier=tier)
        return row

    async def close_session(self, session_id: str) -> SessionRow:
        row = await self._get_session_row(session_id)
        busy = [a.turn_id for a in self._active.values() if a.session_id == session_id]
        if busy or self._submitting[session_id]:
            what = f"unfinished turns {busy}" if busy else "a turn being submitted"
            raise RequestError(
                "session_busy",
                f"session {session_id} still has {what}; wait for or cancel them",
                turn_ids=busy,
            )
        self._closing[session_id] += 1
        try:
            row = await self._committer.call(lambda: self._intake.op_close_session(session_id))
        finally:
            self._closing[session_id] -= 1
            if not self._closing[session_id]:
                del self._closing[session_id]
        session = self._sessions.pop(session_id, None)
        self._session_locks.pop(session_id, None)
        if session is not None:
            await anyio.to_thread.run_sync(session.close)
        with bind_ids(session_id=session_id):
            self._log.info("session_closed")
        return row

    async def list_sessions(self) -> list[SessionRow]:
        return await self._committer.call(self._intake.op_list_sessions)

    async def _get_session_row(self, session_id: str) -> SessionRow:
        try:
            return await self._committer.call(lambda: self._intake.op_get_session(session_id))
        except UnknownSessionError:
            raise RequestError(
                "unknown_session",
                f"no session {session_id!r}; list sessions with `hunter session list`",
                session_id=session_id,
            ) from None

    # -- turns ----------------------------------------------------------------------------

    async def submit(self, request: TurnRequest) -> tuple[TurnRow, bool]:
        """Validate, admit and durably accept a turn; returns ``(turn, created)``."""
        if self._draining:
            raise RequestError(
                "draining", "the daemon is draining and accepts no new turns; retry after restart"
            )
        if request.idempotency_key is not None:
            key = request.idempotency_key
            existing = await self._committer.call(
                lambda: self._intake.op_find_turn(request.session_id, key)
            )
            if existing is not None:
                return existing, False
        session = self._sessions.get(request.session_id)
        if session is None or self._closing[request.session_id]:
            row = await self._get_session_row(request.session_id)
            if row.state is not SessionState.OPEN or self._closing[request.session_id]:
                raise RequestError(
                    "session_closed",
                    f"session {request.session_id} is closed; open a new one",
                    session_id=request.session_id,
                )
            raise RequestError(
                "session_unavailable",
                f"session {request.session_id} is not loaded in this daemon",
                session_id=request.session_id,
            )
        if request.instruction is not None:
            self._admit(request.instruction.command_type)
        self._submitting[request.session_id] += 1
        try:
            if request.process is not None:
                await self._check_process(session, request)
            turn, created = await self._committer.call(
                lambda: self._intake.op_accept_turn(
                    session_id=request.session_id,
                    kind=request.kind,
                    spec=request.to_spec(),
                    idempotency_key=request.idempotency_key,
                )
            )
            if created:
                self._start_turn(turn, recovered=False, request=request)
        finally:
            self._submitting[request.session_id] -= 1
            if not self._submitting[request.session_id]:
                del self._submitting[request.session_id]
        if created:
            self._accepted_total += 1
            # The ids as fields rather than `bind_ids` (same event, no context-variable scan).
            self._log.info(
                "turn_accepted",
                session_id=turn.session_id,
                turn_number=turn.turn_number,
                turn_id=turn.turn_id,
                kind=turn.kind.value,
            )
        return turn, created

    def _admit(self, command_type: ExecutorCommandType) -> None:
        try:
            self._hub.admit(command_type)
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
        try:
            await anyio.to_thread.run_sync(
                session.check_turn_request,
                list(request.process.argv),
                self._runtime_outputs(request.declared_outputs),
            )
        except Exception as exc:
            code = _error_code(exc, default="turn_rejected")
            raise RequestError(code, str(exc), session_id=request.session_id) from exc

    @staticmethod
    def _runtime_outputs(declared: Sequence[DeclaredOutput]) -> list[dict[str, str]]:
        """Declared outputs as the sandbox runtime takes them (role defaults to "output")."""
        return [{"path": d.path, "role": d.role or "output"} for d in declared]

    def _remember(self, turn: TurnRow) -> None:
        """Keep recently finished turns in memory so that waits and gets skip the database
        (a final turn never changes again)."""
        if not turn.final:
            return
        self._recent[turn.turn_id] = turn
        self._recent.move_to_end(turn.turn_id)
        while len(self._recent) > _RECENT_TURNS:
            self._recent.popitem(last=False)

    async def get_turn(self, turn_id: int) -> TurnRow:
        cached = self._recent.get(turn_id)
        if cached is not None and cached.turn_id not in self._active:
            return cached
        try:
            return await self._committer.call(lambda: self._intake.op_get_turn(turn_id))
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
    ) -> TurnRow:
        """Wait until the turn is final or parked (escalated), or its state is in *until*,
        or *timeout_s* passes; returns the turn as it is then."""
        limit = self.settings.wait_limit_s if timeout_s is None else timeout_s
        with anyio.move_on_after(limit):
            while True:
                active = self._active.get(turn_id)
                if active is None or active.settled or active.state in until:
                    break
                if until:
                    await active.wait_changed()
                else:
                    await active.wait_settled()
        return await self.get_turn(turn_id)

    async def cancel_turn(self, turn_id: int) -> TurnRow:
        turn = await self.get_turn(turn_id)
        if turn.final:
            return turn
        active = self._active.get(turn_id)
        if active is None:
            raise RequestError("not_cancellable", f"turn {turn_id} is not active", turn_id=turn_id)
        active.cancel_requested = True
        if active.state is TurnState.ESCALATED and active.resolved is not None:
            # A parked turn: unless an operator's decision is already on its way (the turn
            # task then sees `cancel_requested` once it has carried it out), cancel it.
            if active.claim_resolution("cancel"):
                active.resolved.set()
        elif active.scope is not None:
            active.scope.cancel()
        await active.wait_finished()
        return await self.get_turn(turn_id)

    async def list_turns(self, *, session_id: str | None = None) -> list[TurnRow]:
        return await self._committer.call(lambda: self._intake.op_list_turns(session_id=session_id))

    async def counts(self) -> dict[str, int]:
        return await self._committer.call(self._intake.op_counts)

    async def verify_ledgers(self, *, session_id: str | None = None) -> dict[str, object]:
        """Verify the exec and evidence ledgers of one session (or of every session)."""
        from ledger import IntegrityError, session_dir_for, verify_session_dir

        if session_id is not None:
            rows = [await self._get_session_row(session_id)]
        else:
            rows = await self.list_sessions()
        reports: list[dict[str, object]] = []
        failures: list[dict[str, object]] = []
        for row in rows:
            session_dir = session_dir_for(self.settings.root, row.tier, row.session_id)
            try:
                found = await anyio.to_thread.run_sync(verify_session_dir, session_dir)
            except IntegrityError as exc:
                failures.append({"session_id": row.session_id, "error": str(exc)})
                continue
            reports.extend(
                {
                    "session_id": row.session_id,
                    "ledger_id": r.ledger_id,
                    "path": str(r.path),
                    "entries": r.entries,
                    "head_seq": r.head_seq,
                    "warnings": list(r.warnings),
                }
                for r in found
            )
        return {"ok": not failures, "ledgers": reports, "failures": failures}

    async def list_escalations(self) -> list[TurnRow]:
        return await self._committer.call(
            lambda: self._intake.op_list_turns(states=(TurnState.ESCALATED,))
        )

    async def resolve_escalation(self, turn_id: int, action: str) -> TurnRow:
        """Operator's decision for a parked turn: ``retry`` or ``terminate``."""
        if action not in {"retry", "terminate"}:
            raise RequestError(
                "bad_request", "action: must be 'retry' or 'terminate'", field="action"
            )
        turn = await self.get_turn(turn_id)
        active = self._active.get(turn_id)
        resolved = active.resolved if active is not None else None
        if turn.state is TurnState.ESCALATED and active is not None and resolved is None:
            raise RequestError(
                "not_escalated",
                f"turn {turn_id} is not parked yet (the daemon is starting); try again",
                turn_id=turn_id,
                state=turn.state.value,
            )
        if turn.state is not TurnState.ESCALATED or active is None or resolved is None:
            raise RequestError(
                "not_escalated",
                f"turn {turn_id} is {turn.state.value}, not escalated",
                turn_id=turn_id,
                state=turn.state.value,
            )
        # Claimed with no await since the checks: a concurrent resolve (or cancel) sees it.
        if not active.claim_resolution(action):
            raise RequestError(
                "not_escalated",
                f"turn {turn_id} is already being resolved",
                turn_id=turn_id,
                state=turn.state.value,
            )
        if action == "retry":
            try:
                await self._committer.call(
                    lambda: self._intake.op_set_state(turn_id, TurnState.ACCEPTED)
                )
            except BaseException:
                if active.resolution == action:
                    active.resolution = None
                raise
        active.settled = False
        resolved.set()
        if action == "terminate":
            await active.wait_finished()  # the turn task writes the ledgers, then the intake
        return await self.get_turn(turn_id)

    # -- turn tasks -----------------------------------------------------------------------

    def _start_turn(
        self, turn: TurnRow, *, recovered: bool, request: TurnRequest | None = None
    ) -> None:
        assert self._tg is not None, "scheduler is not running"
        active = _Active(
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            turn_number=turn.turn_number,
            kind=turn.kind,
            state=turn.state,
            attempt=turn.attempt,
        )
        self._active[turn.turn_id] = active
        if request is not None:
            self._requests[turn.turn_id] = request
        self._tg.start_soon(self._turn_task, turn, active, recovered, name=f"turn-{turn.turn_id}")

    async def _turn_task(self, turn: TurnRow, active: _Active, recovered: bool) -> None:
        # Every task runs in its own copy of the context, so the ids bound here label every
        # event of this turn (the hub's too) and vanish with the task: no restore needed, which
        # spares `bind_ids`' scan of the whole context on the hot path.
        structlog.contextvars.bind_contextvars(
            session_id=turn.session_id, turn_number=turn.turn_number, turn_id=turn.turn_id
        )
        try:
            while True:
                with anyio.CancelScope() as scope:
                    active.scope = scope
                    if turn.state is TurnState.ESCALATED:
                        turn = await self._park(turn, active)
                    elif turn.kind is TurnKind.INSTRUCTION:
                        turn = await self._run_instruction(turn, active, recovered)
                    else:
                        turn = await self._run_process(turn, active, recovered)
                active.scope = None
                if active.cancel_requested:
                    await self._finish_cancelled(turn, active)
                    return
                if turn.state is TurnState.ESCALATED:
                    continue
                if turn.state is not TurnState.ACCEPTED or self._draining:
                    return
                recovered = False  # resolved with --retry: run again
        except Exception as exc:  # a bug or a broken dependency ends this turn, not the daemon
            self._log.exception("turn_failed", error_type=type(exc).__name__, error=str(exc))
            await self._finish_error(turn, active, exc)
        finally:
            if self._active.get(active.turn_id) is active:
                del self._active[active.turn_id]
                self._requests.pop(active.turn_id, None)
            active.mark_finished()

    async def _park(self, turn: TurnRow, active: _Active) -> TurnRow:
        """Wait for an operator's decision on an escalated turn (`resolve_escalation`)."""
        resolved = active.resolved = anyio.Event()
        active.settle()  # waiters return: the turn needs a person now
        active.move(TurnState.ESCALATED)
        await resolved.wait()
        action, active.resolution = active.resolution, None
        if action == "cancel":
            return turn
        self._log.info("escalation_resolved", action=action)
        if action == "terminate":  # (a crash before the intake's commit leaves it parked)
            turn = await self._end_turn(
                turn,
                active,
                TurnState.TERMINATED,
                verdict=Verdict.TERMINATE.name,
                reason_code="OPERATOR_TERMINATED",
                reason="an operator terminated the escalated turn",
            )
            self._count_finished(turn)
            return turn
        turn = await self.get_turn(turn.turn_id)
        # retry: a fresh attempt budget, as if the turn had just been accepted
        active.move(TurnState.ACCEPTED)
        return dataclasses.replace(turn, attempt=0, state=TurnState.ACCEPTED)

    async def _finish_error(self, turn: TurnRow, active: _Active, exc: Exception) -> None:
        """End a turn whose run raised: `rejected` when the sandbox refused it, else
        `terminated` with INTERNAL_ERROR; the ledgers still get the turn's entries."""
        code = _error_code(exc, default="internal")
        state = TurnState.REJECTED if code != "internal" else TurnState.TERMINATED
        reason_code = "INTERNAL_ERROR" if code == "internal" else code.upper()
        try:
            turn = await self._committer.call(
                functools.partial(
                    self._intake.op_set_state,
                    turn.turn_id,
                    state,
                    verdict=Verdict.TERMINATE.name,
                    reason_code=reason_code,
                    reason=f"{type(exc).__name__}: {exc}",
                )
            )
            active.move(state)
            await self._record_end(turn, status=state.value)
        except Exception as again:  # the intake or ledger itself is broken: log, keep serving
            self._log.exception("turn_finish_failed", error=str(again))
            return
        self._log.info("turn_finished", state=state.value, reason_code=reason_code)
        self._count_finished(turn)

    async def _finish_cancelled(self, turn: TurnRow, active: _Active) -> None:
        current = await self.get_turn(turn.turn_id)
        if current.final:
            return  # it ended before the cancellation reached it
        turn = await self._end_turn(
            current,
            active,
            TurnState.CANCELLED,
            reason_code="CANCELLED_BY_CLIENT",
            reason="cancelled through the control API",
        )
        self._log.info("turn_finished", state=turn.state.value, attempts=len(turn.attempts))
        self._count_finished(turn)

    async def _end_turn(
        self,
        turn: TurnRow,
        active: _Active,
        state: TurnState,
        *,
        rows: Sequence[AttemptRow] = (),
        **ending: Any,
    ) -> TurnRow:
        """End (or park) *turn* in *state* on the daemon's own decision, with its finished
        attempt *rows*: both ledger entries first, then the intake (a crash in between runs or
        parks the turn again after the restart; it never ends without its entries)."""
        done = {r.attempt for r in rows}
        attempts = (*(a for a in turn.attempts if a.attempt not in done), *rows)
        await self._record_end(
            dataclasses.replace(turn, state=state, attempts=attempts, **ending),
            status=state.value,
            any_kind=True,
        )
        turn = await self._committer.call(
            functools.partial(self._intake.op_record_attempts, rows, turn.turn_id, state, **ending)
        )
        self._remember(turn)
        active.move(state)
        return turn

    def _count_finished(self, turn: TurnRow) -> None:
        self._finished_total += 1
        key = turn.state.value
        self._finished_by_state[key] = self._finished_by_state.get(key, 0) + 1

    def _attempt_started(self) -> None:
        self._attempts_running += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle

    def _stop_counting(self, counting: bool) -> bool:
        if counting:
            self._attempt_ended()
        return False

    def _attempt_ended(self) -> None:
        self._attempts_running -= 1
        if self._attempts_running == 0:
            self._idle.set()

    async def _sleep_until(self, when_us: int | None) -> None:
        if when_us is None:
            return
        delay = (when_us - now_us()) / 1_000_000
        if delay > 0:
            await anyio.sleep(delay)

    # -- instruction turns ----------------------------------------------------------------

    async def _run_instruction(self, turn: TurnRow, active: _Active, recovered: bool) -> TurnRow:
        spec = self._spec(turn)
        assert spec.instruction is not None
        ins = spec.instruction
        options = self.settings.retry
        execution_id = f"EXE-{turn.turn_id}"
        attempt = turn.attempt
        pending: tuple[AttemptOutcome, AttemptRow] | None = None
        last_envelope: dict[str, object] | None = None
        if recovered and turn.state is TurnState.RUNNING and attempt >= 1:
            prior = next((a for a in turn.attempts if a.attempt == attempt), None)
            started = prior.started_us if prior is not None else now_us()
            outcome = AttemptOutcome.fault(
                ExecutionFaultType.CRASH,
                f"the daemon stopped while attempt {attempt} was in flight",
            )
            pending = (
                outcome,
                AttemptRow(
                    turn_id=turn.turn_id,
                    attempt=attempt,
                    started_us=started,
                    executor_id=prior.executor_id if prior else None,
                    instruction_id=prior.instruction_id if prior else None,
                    detail="interrupted by a daemon restart",
                ),
            )
            self._log.info("attempt_interrupted", attempt=attempt)
        elif recovered and turn.state is TurnState.WAITING_RETRY:
            await self._sleep_until(turn.next_attempt_us)
        counting = False
        unconfirmed: Pending | None = None  # the `running` commit of the current attempt
        try:
            while True:
                if pending is None:
                    if self._draining:
                        # Leave the turn as it is (accepted / waiting_retry): a restart resumes it.
                        return turn
                    attempt += 1
                    active.attempt = attempt
                    instruction_id = f"INS-{turn.turn_id}-{attempt}"
                    envelope = build_executor_instruction(
                        instruction_id=instruction_id,
                        execution_id=execution_id,
                        command_type=ins.command_type,
                        target_url=ins.target_url,
                        target_selector=ins.target_selector,
                        timestamp=iso_now(),
                        timeout_ms=ins.timeout_ms,
                        parameters=dict(ins.parameters),
                    )
                    last_envelope = instruction_to_wire(envelope)
                    started_us = now_us()
                    self._attempt_started()
                    counting = True  # until the outcome is durable (drain waits for that)
                    # The `running` row is committed while the instruction is already on its
                    # way, and while the ledger entries are written (its fsync is off the
                    # turn's path); the outcome is recorded in the intake only after it is
                    # durable (`unconfirmed` is awaited first). A crash before that commit
                    # leaves the turn `accepted`/`waiting_retry`, and the restart simply runs
                    # the attempt again (as after a crash between the ledgers and the intake).
                    start_commit = self._committer.enqueue(
                        functools.partial(
                            self._intake.op_start_attempt,
                            turn.turn_id,
                            attempt=attempt,
                            instruction_id=instruction_id,
                        ),
                        on_commit=functools.partial(active.move, TurnState.RUNNING),
                    )
                    try:
                        self._log.info(
                            "attempt_started",
                            instruction_id=instruction_id,
                            attempt=attempt,
                            command_type=ins.command_type.value,
                        )
                        report = await self._hub.run_attempt(envelope)
                    except BaseException:
                        # The `running` row lands first (whatever ends the turn comes after
                        # it), but its own failure must not hide why the attempt failed.
                        with contextlib.suppress(Exception):
                            await start_commit.result()
                        raise
                    unconfirmed = start_commit
                    active.executor_id = report.executor_id
                    response = report.response
                    pending = (
                        report.outcome,
                        AttemptRow(
                            turn_id=turn.turn_id,
                            attempt=attempt,
                            started_us=started_us,
                            executor_id=report.executor_id,
                            instruction_id=instruction_id,
                            detail=_attempt_detail(report.safety_reason_code, report.detail),
                            duration_ms=report.duration_ms,
                        ),
                    )
                    result = _response_result(response, report)
                else:
                    result = {"detail": pending[1].detail}
                outcome, row = pending
                pending = None
                decision = decide_attempt(
                    outcome,
                    phase=spec.phase,
                    attempt_number=row.attempt,
                    options=options,
                    execution_id=execution_id,
                    instruction_id=row.instruction_id or f"INS-{turn.turn_id}-{row.attempt}",
                )
                finished = now_us()
                row = dataclasses.replace(
                    row,
                    finished_us=finished,
                    outcome=outcome.kind.name,
                    fault_type=_enum_value(outcome.fault_type),
                    exit_code=outcome.exit_code,
                    decision=decision.verdict.name,
                    reason_code=decision.reason_code,
                    reason=decision.reason,
                    duration_ms=row.duration_ms
                    if row.duration_ms is not None
                    else (finished - row.started_us) // 1000,
                )
                # `bind_ids` without its scan of the whole context: set, then reset the tokens.
                log_ids = {
                    k: v
                    for k, v in (
                        ("instruction_id", row.instruction_id),
                        ("executor_id", row.executor_id),
                    )
                    if v is not None
                }
                tokens = structlog.contextvars.bind_contextvars(**log_ids)
                try:
                    if outcome.kind is OutcomeKind.FAULT:
                        self._log.info(
                            "fault_classified",
                            attempt=row.attempt,
                            fault_type=row.fault_type,
                            decision=row.decision,
                            reason_code=row.reason_code,
                            duration_ms=row.duration_ms,
                            detail=row.detail,
                        )
                    if decision.verdict is Verdict.RETRY:
                        next_us = now_us() + decision.delay_ms * 1000
                        await _confirmed(unconfirmed)
                        unconfirmed = None
                        turn = await self._committer.call(
                            functools.partial(
                                self._intake.op_record_attempts,
                                [row],
                                turn.turn_id,
                                TurnState.WAITING_RETRY,
                                next_attempt_us=next_us,
                                fault_type=_enum_value(outcome.fault_type),
                            )
                        )
                        active.move(TurnState.WAITING_RETRY)
                        counting = self._stop_counting(counting)
                        self._log.info(
                            "retry_scheduled",
                            attempt=row.attempt,
                            delay_ms=decision.delay_ms,
                            reason_code=decision.reason_code,
                        )
                        if decision.delay_ms:
                            await anyio.sleep(decision.delay_ms / 1000)
                        continue
                    state = _final_state(outcome, decision)
                    result = {**result, "last_instruction": last_envelope}
                    ending: dict[str, Any] = {
                        "verdict": decision.verdict.name,
                        "reason_code": decision.reason_code,
                        "reason": decision.reason,
                        "fault_type": _enum_value(outcome.fault_type),
                        "result": result,
                    }
                    # Ledgers first, then the intake: a crash in between re-runs the attempt after
                    # the restart (the ledger then shows both), it never leaves a turn without its
                    # ledger entries.
                    await self._record_end(
                        dataclasses.replace(
                            turn,
                            state=state,
                            attempts=(*(a for a in turn.attempts if a.attempt != row.attempt), row),
                            **ending,
                        ),
                        status=state.value,
                    )
                    await _confirmed(unconfirmed)
                    unconfirmed = None
                    turn = await self._committer.call(
                        functools.partial(
                            self._intake.op_record_attempts, [row], turn.turn_id, state, **ending
                        )
                    )
                    self._remember(turn)
                    active.move(state)
                    counting = self._stop_counting(counting)
                    if state is TurnState.ESCALATED:
                        self._log.info(
                            "turn_escalated",
                            attempt=row.attempt,
                            fault_type=row.fault_type,
                            reason_code=decision.reason_code,
                        )
                    else:
                        self._log.info(
                            "turn_finished",
                            state=state.value,
                            attempts=row.attempt,
                            decision=decision.verdict.name,
                            reason_code=decision.reason_code,
                            duration_ms=(now_us() - turn.accepted_us) // 1000,
                        )
                        self._count_finished(turn)
                    return turn
                finally:
                    structlog.contextvars.reset_contextvars(**tokens)
        finally:
            self._stop_counting(counting)

    async def _record_end(self, turn: TurnRow, *, status: str, any_kind: bool = False) -> None:
        """Write the turn's exec and evidence ledger entries: instruction turns always; process
        turns (whose runtime writes their entries) only for the daemon's own decisions such as
        an operator's terminate (*any_kind*)."""
        if turn.kind is not TurnKind.INSTRUCTION and not any_kind:
            return
        session = self._sessions.get(turn.session_id)
        if session is None:
            self._log.error("ledger_write_skipped", reason="session not loaded")
            return
        calls = [
            {
                "executor_id": a.executor_id,
                "instruction_id": a.instruction_id,
                "attempt": a.attempt,
                "outcome": a.outcome,
                "fault_type": a.fault_type,
                "decision": a.decision,
                "reason_code": a.reason_code,
                "duration_ms": a.duration_ms,
            }
            for a in turn.attempts
        ]
        result = dict(turn.result) if turn.result is not None else {}
        result.update(
            state=turn.state.value,
            verdict=turn.verdict,
            reason_code=turn.reason_code,
            fault_type=turn.fault_type,
        )
        await session.record_instruction_turn(
            turn_number=turn.turn_number,
            instruction=dict(turn.spec),
            result=result,
            status=status,
            external_calls=calls,
        )

    # -- process turns --------------------------------------------------------------------

    async def _run_process(self, turn: TurnRow, active: _Active, recovered: bool) -> TurnRow:
        spec = self._spec(turn)
        assert spec.process is not None
        session = self._sessions[turn.session_id]
        options = self.settings.retry
        used = turn.attempt
        if recovered and turn.state is TurnState.RUNNING and used >= 1:
            outcome = AttemptOutcome.fault(
                ExecutionFaultType.CRASH, f"the daemon stopped while attempt {used} was running"
            )
            decision = decide_attempt(
                outcome,
                phase=spec.phase,
                attempt_number=used,
                options=options,
                execution_id=f"EXE-{turn.turn_id}",
                instruction_id=f"INS-{turn.turn_id}-{used}",
            )
            prior = next((a for a in turn.attempts if a.attempt == used), None)
            row = AttemptRow(
                turn_id=turn.turn_id,
                attempt=used,
                started_us=prior.started_us if prior else now_us(),
                finished_us=now_us(),
                outcome=outcome.kind.name,
                fault_type=ExecutionFaultType.CRASH.value,
                decision=decision.verdict.name,
                reason_code=decision.reason_code,
                reason=decision.reason,
                detail="interrupted by a daemon restart",
            )
            self._log.info(
                "fault_classified",
                attempt=used,
                fault_type=row.fault_type,
                decision=row.decision,
                reason_code=row.reason_code,
            )
            if decision.verdict is not Verdict.RETRY:
                state = _final_state(outcome, decision)
                # The runtime never saw this ending: the scheduler writes the ledger entries.
                turn = await self._end_turn(
                    turn,
                    active,
                    state,
                    rows=[row],
                    verdict=decision.verdict.name,
                    reason_code=decision.reason_code,
                    reason=decision.reason,
                    fault_type=ExecutionFaultType.CRASH.value,
                )
                self._log.info("turn_finished", state=state.value, attempts=used)
                if state is not TurnState.ESCALATED:
                    self._count_finished(turn)
                return turn
            await self._committer.call(functools.partial(self._intake.op_finish_attempt, row))
            await anyio.sleep(decision.delay_ms / 1000)
            options = dataclasses.replace(options, max_attempts=max(1, options.max_attempts - used))
        else:
            used = 0
        lock = self._session_locks.setdefault(turn.session_id, anyio.Lock())
        async with lock, self._process_limiter:
            if self._draining:
                return turn
            first = used + 1
            started_us = now_us()
            self._attempt_started()
            self._process_running += 1
            try:
                await self._committer.call(
                    lambda: self._intake.op_start_attempt(turn.turn_id, attempt=first)
                )
                active.move(TurnState.RUNNING)
                active.attempt = first
                self._log.info("attempt_started", attempt=first, argv0=spec.process.argv[0])
                result = await session.run_process_turn(
                    list(spec.process.argv),
                    declared_outputs=self._runtime_outputs(spec.declared_outputs),
                    declared_inputs=list(spec.declared_inputs),
                    phase=spec.phase,
                    timeout_ms=spec.process.timeout_ms,
                    turn_number=turn.turn_number,
                    options=options,
                )
                state = _process_status_to_state(str(result.status))
                rows = _process_attempt_rows(turn.turn_id, first, started_us, result)
                turn = await self._committer.call(
                    functools.partial(
                        self._intake.op_record_attempts,
                        rows,
                        turn.turn_id,
                        state,
                        verdict=_enum_value(getattr(result, "verdict", None)),
                        reason_code=getattr(result, "reason_code", None),
                        reason=getattr(result, "reason", None),
                        fault_type=_enum_value(getattr(result, "fault_type", None)),
                        result=_process_result_dict(result),
                    )
                )
            finally:
                self._process_running -= 1
                self._attempt_ended()
        self._remember(turn)
        active.move(state)
        for r in rows:
            if r.fault_type is not None:
                self._log.info(
                    "fault_classified",
                    attempt=r.attempt,
                    fault_type=r.fault_type,
                    decision=r.decision,
                    reason_code=r.reason_code,
                    duration_ms=r.duration_ms,
                )
        if state is TurnState.ESCALATED:
            self._log.info("turn_escalated", reason_code=turn.reason_code)
        else:
            self._log.info(
                "turn_finished",
                state=state.value,
                attempts=len(rows),
                reason_code=turn.reason_code,
                duration_ms=(now_us() - started_us) // 1000,
            )
            self._count_finished(turn)
        return turn


async def _confirmed(pending: Pending | None) -> None:
    """Wait until a queued intake operation is durable (raises its error)."""
    if pending is not None:
        await pending.result()


def _attempt_detail(safety_reason_code: str, detail: str) -> str:
    parts = [p for p in (safety_reason_code, detail) if p]
    return ": ".join(parts)


def _response_result(response: Any, report: AttemptReportLike) -> dict[str, object]:
    result: dict[str, object] = {
        "executor_id": report.executor_id,
        "safety_reason_code": report.safety_reason_code,
        "detail": report.detail,
    }
    if response is not None:
        result.update(
            response_type=_enum_value(getattr(response, "response_type", None)),
            evidence_hash=getattr(response, "evidence_hash", None),
            error_message=getattr(response, "error_message", None),
            output=deep_thaw(getattr(response, "output", {}) or {}),
            partial=bool(getattr(response, "partial", False)),
        )
    return result


def _process_attempt_rows(
    turn_id: int, first: int, started_us: int, result: Any
) -> list[AttemptRow]:
    rows: list[AttemptRow] = []
    records = tuple(getattr(result, "attempts", ()) or ())
    for i, rec in enumerate(records):
        get = rec.get if isinstance(rec, Mapping) else (lambda k, r=rec: getattr(r, k, None))
        duration = get("duration_ms")
        rows.append(
            AttemptRow(
                turn_id=turn_id,
                attempt=first + i,
                started_us=int(get("started_us") or started_us),
                finished_us=now_us(),
                outcome=_enum_value(get("outcome_kind") or get("outcome") or get("kind")),
                fault_type=_enum_value(get("fault_type")),
                exit_code=get("exit_code"),
                decision=_enum_value(get("verdict") or get("decision")),
                reason_code=get("reason_code"),
                reason=get("reason"),
                detail=get("detail") or get("message"),
                duration_ms=int(duration) if isinstance(duration, int | float) else None,
            )
        )
    if not rows:
        rows.append(
            AttemptRow(
                turn_id=turn_id,
                attempt=first,
                started_us=started_us,
                finished_us=now_us(),
                outcome=None,
                fault_type=_enum_value(getattr(result, "fault_type", None)),
                exit_code=getattr(result, "exit_code", None),
                decision=_enum_value(getattr(result, "verdict", None)),
                reason_code=getattr(result, "reason_code", None),
                reason=getattr(result, "reason", None),
                duration_ms=getattr(result, "duration_ms", None),
            )
        )
    return rows


def _process_result_dict(result: Any) -> dict[str, object]:
    to_dict = getattr(result, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, Mapping):
            return {str(k): v for k, v in data.items()}
    return {
        "status": str(getattr(result, "status", "")),
        "exit_code": getattr(result, "exit_code", None),
    }


def _error_code(exc: BaseException, *, default: str) -> str:
    name = type(exc).__name__
    table = {
        "PackageNotFoundError": "unknown_package",
        "ManifestError": "bad_manifest",
        "DeclarationError": "declaration_error",
        "CapabilityViolation": "capability_violation",
        "SandboxUnavailableError": "sandbox_unavailable",
    }
    return table.get(name, default)
