"""A process turn from request to ledger entries: checks, attempts, promotion, records.

Before anything runs, the request is checked (``argv``, the one ``declared_outputs`` parser of
``sandbox.policy.declarations``, the executable and every declared destination against the
capabilities); a refused request is a *rejected* turn. The attempts go through THE attempt loop
(``sandbox.policy.attempt_loop.run_attempts``): its runner is one confined run
(``sandbox.runtime.attempt``), its hooks keep the turn's progress and log; time and sleep are
injected here, at the edge. On SUCCEED the declared outputs are promoted into the workspace.
Both ledger entries are written for every turn, also one cut short by cancellation or an error;
in the daemon's mode (``caller_commits``) the normal ending's pair is sealed for the caller's
store instead, and a turn cut short is left to the caller to record. Then the session's sandbox
dirs are emptied (nothing a turn wrote stays there after it).

Longer than 600 lines, and `ProcessTurn` longer than 400, on purpose: every way a turn ends
(rejected, finished, promoted or not, aborted) and the ledger entries it writes stay next to
each other in one class, so none is missed.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio
import anyio.to_thread
import structlog

from ledger import LedgerEntry
from ledger.chain import content_hash
from ledger.pending import PendingLines
from sandbox.capabilities import resolve_command
from sandbox.enumerate import RealizedWrite
from sandbox.errors import (
    CapabilityViolation,
    ConfinementLostError,
    DeclarationError,
    SandboxUnavailableError,
)
from sandbox.policy.attempt_loop import AttemptReport, run_attempts
from sandbox.policy.attempt_record import AttemptRecord as LoopRecord
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    OutcomeKind,
    RetryOptions,
    Verdict,
)
from sandbox.policy.declarations import DeclarationProblem, DeclaredOutput, compare_surface
from sandbox.policy.declarations import parse_declared_outputs as _parse_declared_outputs
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.retry_protocol import EntropyDetector, ToolCall
from sandbox.promote import PromotedOutput, PromotionError, StagedOutputs
from sandbox.prompt_header import PromptHeader
from sandbox.runs import ConfinedRun, ProcessAttempt, crashed_run, ms_since
from sandbox.runtime.attempt import SPAWN_FAILED, capability_violation
from sandbox.runtime.confined_area import ConfinedArea, StagingArea
from sandbox.runtime.view import RuntimeView

if TYPE_CHECKING:
    from ledger import SessionLedgers
    from sandbox.capabilities import CompiledCapabilities
    from sandbox.packages import Package

__all__ = [
    "CAPABILITY_REJECTED",
    "CONFINEMENT_LOST",
    "DECLARATION_INVALID",
    "PROMOTION_FAILED",
    "PROMOTION_IO_FAILED",
    "SANDBOX_UNAVAILABLE",
    "SPAWN_FAILED",
    "TURN_CANCELLED",
    "TURN_ERROR",
    "ProcessTurn",
    "TurnResult",
    "TurnStatus",
    "check_request",
    "digest",
    "parse_declared_outputs",
]

_log = structlog.get_logger("sandbox.runtime.process_turn")


class TurnSession(Protocol):
    """What a process turn needs of its session (`session.Session`, which runs it: this module
    sits below it)."""

    @property
    def session_id(self) -> str: ...

    @property
    def runtime(self) -> RuntimeView: ...

    @property
    def package(self) -> Package: ...

    @property
    def capabilities(self) -> CompiledCapabilities: ...

    @property
    def ledgers(self) -> SessionLedgers: ...

    @property
    def area(self) -> ConfinedArea: ...

    @property
    def workspace(self) -> Path: ...

    @property
    def output_dir(self) -> Path: ...

    def prompt_header(
        self,
        *,
        turn_number: int,
        declared_inputs: Sequence[str] = (),
        declared_outputs: Sequence[Mapping[str, str]] = (),
    ) -> PromptHeader: ...


TurnStatus = Literal[
    "succeeded",
    "failed",
    "timeout",
    "violation",
    "exhausted",
    "escalated",
    "rejected",
    "terminated",
]

# Reason codes of the sandbox edge (the policy core's codes are in sandbox/policy/reason_codes.py).
DECLARATION_INVALID: Final = "DECLARATION_INVALID"
CAPABILITY_REJECTED: Final = "CAPABILITY_REJECTED"
SANDBOX_UNAVAILABLE: Final = "SANDBOX_UNAVAILABLE"
PROMOTION_FAILED: Final = "PROMOTION_FAILED"
PROMOTION_IO_FAILED: Final = "PROMOTION_IO_FAILED"
#: What a lost sandbox helper (outputs gone before promotion) makes of the attempt: a CRASH.
CONFINEMENT_LOST: Final = "CONFINEMENT_LOST"
TURN_CANCELLED: Final = "TURN_CANCELLED"
TURN_ERROR: Final = "TURN_ERROR"


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The result of one process turn (every field is also in ``to_dict``)."""

    session_id: str
    turn_number: int
    status: TurnStatus
    exit_code: int | None
    fault_type: str | None
    verdict: str
    reason_code: str
    reason: str
    attempts: tuple[ProcessAttempt, ...]
    realized_writes: tuple[RealizedWrite, ...]
    violations: tuple[CapabilityViolation, ...]
    promoted_outputs: tuple[PromotedOutput, ...]
    duration_ms: int
    enforcement: Mapping[str, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    #: the turn's exec and evidence entries when the caller commits them (``ledger_commit=
    #: "caller"``): checked, not yet sealed; the caller's store seals them once the ending's
    #: fence held, in the transaction that commits it
    pending_lines: PendingLines | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``hunter turn --json``)."""
        return {
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "status": self.status,
            "exit_code": self.exit_code,
            "fault_type": self.fault_type,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "attempts": [a.to_dict() for a in self.attempts],
            "realized_writes": [w.to_dict() for w in self.realized_writes],
            "violations": [v.to_dict() for v in self.violations],
            "promoted_outputs": [p.to_dict() for p in self.promoted_outputs],
            "duration_ms": self.duration_ms,
            "enforcement": dict(self.enforcement),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }

    def raise_for_violation(self) -> None:
        """Raise the first ``CapabilityViolation`` of the turn, if there is one (FR-RT-016)."""
        if self.violations:
            raise self.violations[0]


@dataclass(slots=True)
class _TurnProgress:
    """What a running turn has done so far, so a turn cut short still records it."""

    request: dict[str, object]
    attempts: list[ProcessAttempt] = field(default_factory=list)
    violations: list[CapabilityViolation] = field(default_factory=list)
    recorded: list[dict[str, object]] = field(default_factory=list)
    promoted: list[PromotedOutput] = field(default_factory=list)
    #: True once both ledger entries of the turn are written
    written: bool = False


class _ProcessHooks:
    """THE attempt loop's hooks for a process turn: a retried attempt is recorded on the turn's
    progress (so a turn cut short during its backoff still records it) and logged."""

    __slots__ = ("_finished", "_session_id", "_turn", "last")

    def __init__(
        self,
        session_id: str,
        turn: int,
        finished: Callable[[ConfinedRun, AttemptDecision], None],
    ) -> None:
        self._session_id = session_id
        self._turn = turn
        self._finished = finished
        self.last: ConfinedRun | None = None

    async def attempt_started(self, attempt: LoopRecord) -> None:
        del attempt

    async def retry_scheduled(
        self, attempt: LoopRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        del next_attempt_us
        assert self.last is not None
        self._finished(self.last, decision)
        _log.info(
            "retry_scheduled",
            session_id=self._session_id,
            turn_number=self._turn,
            attempt=attempt.attempt,
            delay_ms=decision.delay_ms,
        )


def _now_us() -> int:
    return time.time_ns() // 1000


#: a request's or result's hash in a turn entry (the ledger's one definition)
digest = content_hash


def parse_declared_outputs(declared: object) -> tuple[DeclaredOutput, ...]:
    """Validate ``declared_outputs`` (FR-RT-013) with the one parser of
    ``sandbox.policy.declarations``; raise ``DeclarationError`` naming the field."""
    try:
        return _parse_declared_outputs(declared)
    except DeclarationProblem as exc:
        raise DeclarationError(field=exc.field, problem=exc.problem) from None


def check_request(
    session: TurnSession, argv: Sequence[str], declared_outputs: object, turn: int
) -> tuple[str, tuple[DeclaredOutput, ...]]:
    """Validate a request; return the resolved executable and the declarations.

    Raises ``DeclarationError`` (shape) or ``CapabilityViolation`` (not allowed).
    """
    items: Sequence[object] = argv
    if not items or not all(isinstance(a, str) and "\0" not in a for a in items):
        raise DeclarationError(field="argv", problem="a non-empty list of strings")
    declared = parse_declared_outputs(declared_outputs)
    exe = resolve_command(
        argv[0], cwd=session.output_dir, search_path=session.runtime.config.turn_path
    )
    if exe is None:
        raise capability_violation(
            session.session_id,
            turn,
            "execute",
            argv[0],
            "capabilities.execute",
            "command not found or not executable",
        )
    check = session.capabilities.check_execute(exe, args=argv[1:])
    if not check.allowed:
        detail = f"resolved to {exe}"
        if check.matched:
            detail += f"; matches forbidden pattern {check.matched!r}"
        if check.reason:
            detail += f"; {check.reason}"
        raise capability_violation(
            session.session_id, turn, "execute", argv[0], check.capability, detail
        )
    for out in declared:
        if out.is_scratch:  # never promoted: it names no destination in the workspace
            continue
        wcheck = session.capabilities.check_write(session.workspace / out.path)
        if not wcheck.allowed:
            detail = f"destination {wcheck.path}"
            if wcheck.matched:
                detail += f"; matches forbidden pattern {wcheck.matched!r}"
            raise capability_violation(
                session.session_id, turn, "declare", out.path, wcheck.capability, detail
            )
    return exe, declared


class ProcessTurn:
    """One process turn of a session: checks, THE attempt loop over confined runs, promotion,
    and both ledger entries, written in every case (a rejection, an abort included)."""

    def __init__(
        self, session: TurnSession, turn: int, argv: Sequence[str], *, caller_commits: bool = False
    ) -> None:
        self.session = session
        self.turn = turn
        #: the normal ending's two lines are sealed, not synced: the caller's store commits them
        #: with the turn's ending. A rejection is still recorded here (durably; its result
        #: is returned, never raised); a turn cut short (cancelled, an error) is not: the
        #: caller records how it ended.
        self.caller_commits = caller_commits
        self.progress = _TurnProgress(request={"argv": list(argv)})

    async def execute(
        self,
        argv: Sequence[str],
        *,
        declared_outputs: object,
        declared_inputs: Sequence[str],
        phase: AgentPhase | None,
        timeout_ms: int | None,
        options: RetryOptions,
        delay: Callable[[float], Awaitable[None]],
        entropy_detector: EntropyDetector | None,
        first_attempt: int = 1,
        before_promote: Callable[[], Awaitable[None]] | None = None,
        commit: Callable[[TurnResult], Awaitable[None]] | None = None,
    ) -> TurnResult:
        """Run the turn (see `Session.run_process_turn`); a turn cut short is still recorded.
        *first_attempt*: the turn's number for the first attempt run here."""
        start_ns = time.monotonic_ns()
        progress = self.progress
        try:
            return await self._run(
                progress,
                argv=list(argv),
                declared_outputs=declared_outputs,
                declared_inputs=tuple(declared_inputs),
                phase=phase,
                timeout_ms=timeout_ms,
                turn=self.turn,
                options=options,
                delay=delay,
                entropy_detector=entropy_detector,
                first_attempt=first_attempt,
                before_promote=before_promote,
                commit=commit,
            )
        except BaseException as exc:
            # A caller that commits the entries also writes them for a turn cut short (it
            # decides how the turn ends: cancelled, or run again after a restart).
            if not progress.written and not self.caller_commits:
                with anyio.CancelScope(shield=True):
                    await self._record_aborted(self.turn, progress, exc, start_ns)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._empty_sandbox()

    async def _empty_sandbox(self) -> None:
        """Empty ``tmp/<sid>`` and ``output/<sid>`` once the turn has ended, however it ended.

        Runs after the last attempt's writes were enumerated, compared with the declared
        outputs and recorded, and after promotion: scratch files are not kept between turns
        (the next attempt would remove them anyway). A failure is logged, never raised (the
        turn's result stands; the next attempt empties the directories again).
        """
        try:
            await self.session.area.empty()
        except OSError as exc:
            _log.error(
                "scratch_not_emptied",
                session_id=self.session.session_id,
                turn_number=self.turn,
                when="turn_end",
                error=str(exc),
            )

    async def _record_aborted(
        self, turn: int, progress: _TurnProgress, exc: BaseException, start_ns: int
    ) -> None:
        """Both ledger entries for a turn cut short by cancellation or an internal error.

        The attempt's process tree is already dead (the attempt's cleanup runs shielded).
        The attempts, violations and promotions done before the abort are recorded with it.
        A failure to record is logged; it never replaces the original exception.
        """
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        result = TurnResult(
            session_id=self.session.session_id,
            turn_number=turn,
            status="terminated",
            exit_code=None,
            fault_type=None,
            verdict=Verdict.TERMINATE.value,
            reason_code=TURN_CANCELLED if cancelled else TURN_ERROR,
            reason="the turn was cancelled" if cancelled else f"{type(exc).__name__}: {exc}",
            attempts=tuple(progress.attempts),
            realized_writes=(),
            violations=tuple(progress.violations),
            promoted_outputs=tuple(progress.promoted),
            duration_ms=ms_since(start_ns),
            enforcement=dict(self.session.runtime.levels),
        )
        try:
            await self._record(
                turn, progress.request, result, progress.recorded, declared=(), header=None
            )
        except Exception as record_exc:  # never mask the original exception
            _log.error(
                "turn_record_failed",
                session_id=self.session.session_id,
                turn_number=turn,
                error=repr(record_exc),
            )

    async def _reject(
        self,
        turn: int,
        request: dict[str, object],
        start_ns: int,
        *,
        reason_code: str,
        reason: str,
        violation: CapabilityViolation | None,
        levels: Mapping[str, str],
    ) -> TurnResult:
        violations: tuple[CapabilityViolation, ...] = ()
        recorded: list[dict[str, object]] = []
        if violation is not None:
            recorded = await self._record_violation(turn, violation)
            violations = (violation,)
        result = TurnResult(
            session_id=self.session.session_id,
            turn_number=turn,
            status="rejected",
            exit_code=None,
            fault_type=ExecutionFaultType.SECURITY_VIOLATION.value if violation else None,
            verdict=Verdict.TERMINATE.value,
            reason_code=reason_code,
            reason=reason,
            attempts=(),
            realized_writes=(),
            violations=violations,
            promoted_outputs=(),
            duration_ms=ms_since(start_ns),
            enforcement=dict(levels),
        )
        sealed = await self._record(
            turn, request, result, recorded, declared=(), header=None, seal_only=self.caller_commits
        )
        if sealed is not None:  # the caller seals and commits them with the ending
            result = dataclasses.replace(result, pending_lines=sealed)
        _log.warning(
            "turn_rejected",
            session_id=self.session.session_id,
            turn_number=turn,
            reason_code=reason_code,
            reason=reason,
        )
        return result

    async def _unavailable(
        self,
        turn: int,
        request: dict[str, object],
        start_ns: int,
        exc: SandboxUnavailableError,
        levels: Mapping[str, str],
    ) -> TurnResult:
        """Record a turn refused because a confinement mechanism is missing; the result when
        the caller ends the turn from it, else *exc* again."""
        rejected = await self._reject(
            turn,
            request,
            start_ns,
            reason_code=SANDBOX_UNAVAILABLE,
            reason=str(exc),
            violation=None,
            levels=levels,
        )
        if self.caller_commits:  # recorded: the caller ends the turn from the result
            return rejected
        raise exc

    async def _record_violation(
        self, turn: int, violation: CapabilityViolation
    ) -> list[dict[str, object]]:
        """Write a violation's evidence entry now; return it as the turn entry lists it."""
        entry = await self.session.ledgers.arecord_violation(
            turn_number=turn,
            operation=violation.operation,
            target=violation.target,
            capability=violation.capability,
            detail=violation.detail,
        )
        return _violations_of(entry)

    async def _record(
        self,
        turn: int,
        request: dict[str, object],
        result: TurnResult,
        violations: Sequence[Mapping[str, object]],
        *,
        declared: Sequence[DeclaredOutput],
        header: PromptHeader | None,
        seal_only: bool = False,
    ) -> PendingLines | None:
        """Write the turn's two entries (durable on return), or with *seal_only* check them and
        return them unsealed, for the caller's store to seal and commit with the ending."""
        summary = {
            "status": result.status,
            "exit_code": result.exit_code,
            "realized_writes": [w.to_dict() for w in result.realized_writes],
            "promoted_outputs": [p.to_dict() for p in result.promoted_outputs],
        }
        evidence_extra: dict[str, object] = {
            "enforcement": dict(result.enforcement),
            "realized_writes": [w.to_dict() for w in result.realized_writes],
            "promoted_outputs": [p.to_dict() for p in result.promoted_outputs],
            "surface_problems": [p.to_dict() for a in result.attempts[-1:] for p in a.problems],
            "scratch_writes": _scratch_writes(declared, result.realized_writes),
        }
        if header is not None:
            evidence_extra["prompt_header"] = header.to_dict()
        fields: dict[str, Any] = {
            "turn_number": turn,
            "query_hash": digest(request),
            "result_hash": digest(summary),
            "status": result.status,
            "declared_reads": list(request.get("declared_inputs", [])),  # type: ignore[call-overload]
            "declared_writes": [d.to_dict() for d in declared],
            "capability_violations": list(violations),
            "exec_extra": {
                "argv": request["argv"],
                "exit_code": result.exit_code,
                "fault_type": result.fault_type,
                "verdict": result.verdict,
                "reason_code": result.reason_code,
                "attempt_count": len(result.attempts),
                "duration_ms": result.duration_ms,
                "attempts": [a.ledger_summary() for a in result.attempts],
            },
            "evidence_extra": evidence_extra,
        }
        lines: PendingLines | None = None
        if seal_only:
            lines = self.session.ledgers.turn_lines(**fields)
        else:
            await self.session.ledgers.arecord_turn(**fields)
        self.progress.written = True
        return lines

    async def _commit_then_place(
        self,
        commit: Callable[[TurnResult], Awaitable[None]],
        result: TurnResult,
        staged: StagedOutputs | None,
    ) -> None:
        """The caller records the turn (its durable step: the ending with both ledger lines),
        then the staged outputs go into place; a record refused (the caller lost its lease on
        the turn) discards them, so nothing of the turn reaches the workspace. Placing is only
        renames: once the turn is recorded it happens even when the caller is cancelled."""
        try:
            await commit(result)
        except BaseException:
            if staged is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(staged.discard)
                self.progress.promoted.clear()
            raise
        if staged is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(staged.place)
            except OSError as exc:  # recorded already: say so loudly, the turn stands
                _log.error(
                    "outputs_not_placed",
                    session_id=self.session.session_id,
                    turn_number=self.turn,
                    error=str(exc),
                )

    async def _run(
        self,
        progress: _TurnProgress,
        *,
        argv: list[str],
        declared_outputs: object,
        declared_inputs: tuple[str, ...],
        phase: AgentPhase | None,
        timeout_ms: int | None,
        turn: int,
        options: RetryOptions,
        delay: Callable[[float], Awaitable[None]],
        entropy_detector: EntropyDetector | None,
        first_attempt: int = 1,
        before_promote: Callable[[], Awaitable[None]] | None = None,
        commit: Callable[[TurnResult], Awaitable[None]] | None = None,
    ) -> TurnResult:
        start_ns = time.monotonic_ns()
        request: dict[str, object] = {
            "argv": argv,
            "declared_outputs": _plain(declared_outputs),
            "declared_inputs": list(declared_inputs),
            "phase": None if phase is None else phase.value,
            "timeout_ms": timeout_ms,
        }
        progress.request = request
        levels: Mapping[str, str] = dict(self.session.runtime.levels)
        try:
            self.session.runtime.require_enforcement()
        except SandboxUnavailableError as exc:
            return await self._unavailable(turn, request, start_ns, exc, levels)
        try:
            exe, declared = check_request(self.session, argv, declared_outputs, turn)
        except DeclarationError as exc:
            return await self._reject(
                turn,
                request,
                start_ns,
                reason_code=DECLARATION_INVALID,
                reason=str(exc),
                violation=None,
                levels=levels,
            )
        except CapabilityViolation as exc:
            return await self._reject(
                turn,
                request,
                start_ns,
                reason_code=CAPABILITY_REJECTED,
                reason=str(exc),
                violation=exc,
                levels=levels,
            )
        try:
            levels = await self.session.area.confinement()
        except SandboxUnavailableError as exc:  # the sandbox helper cannot be reached
            return await self._unavailable(turn, request, start_ns, exc, levels)
        header = self.session.prompt_header(
            turn_number=turn,
            declared_inputs=declared_inputs,
            declared_outputs=[d.to_dict() for d in declared],
        )
        limits = self.session.package.manifest.limits
        cfg = self.session.runtime.config
        timeout_s = (
            (timeout_ms / 1000) if timeout_ms is not None else (limits.timeout_s or cfg.timeout_s)
        )
        timeout_s = min(timeout_s, limits.timeout_s or cfg.timeout_s)
        _log.info(
            "turn_started",
            session_id=self.session.session_id,
            turn_number=turn,
            argv=argv,
            phase=request["phase"],
            timeout_ms=int(timeout_s * 1000),
        )
        attempts = progress.attempts
        violations = progress.violations
        recorded = progress.recorded

        async def one_attempt(attempt: LoopRecord) -> AttemptReport[ConfinedRun]:
            """The runner of THE attempt loop: one confined run of the command."""
            run = await self.session.area.run_attempt(
                exe=exe,
                argv=argv,
                declared=declared,
                turn=turn,
                attempt_no=attempt.attempt,
                timeout_s=timeout_s,
            )
            for v in run.violations:
                recorded.extend(await self._record_violation(turn, v))
                violations.append(v)
            hooks.last = run
            return AttemptReport(
                outcome=run.outcome, payload=run, duration_ms=run.record.duration_ms
            )

        def finished(run: ConfinedRun, decision: AttemptDecision) -> None:
            record = _with_decision(run.record, run.outcome, decision)
            attempts.append(record)
            _log.info(
                "attempt_finished",
                session_id=self.session.session_id,
                turn_number=turn,
                attempt=record.attempt_number,
                exit_code=record.exit_code,
                verdict=record.verdict,
                reason_code=record.reason_code,
                duration_ms=record.duration_ms,
            )

        hooks = _ProcessHooks(self.session.session_id, turn, finished)
        name = f"{self.session.session_id}#{turn}"
        loop = functools.partial(
            run_attempts,
            one_attempt,
            phase=phase,
            options=options,
            clock=_now_us,
            sleep=delay,
            hooks=hooks,
            # numbered as the turn numbers them (the daemon's records, log and ledger agree)
            first_attempt=max(1, first_attempt),
            execution_id=self.session.session_id,
            instruction_id=lambda _n: name,
        )
        # No drain here: the loop always ends (with a report, unless an interrupted attempt
        # below ends the turn itself).
        end = await loop()
        assert end is not None
        staged: StagedOutputs | None = None
        while True:
            decision = end.decision
            last_outcome = end.outcome
            ran = end.report.payload if end.report is not None else hooks.last
            assert ran is not None
            finished(ran, decision)
            if decision.verdict is not Verdict.SUCCEED:
                break
            realized = ran.surface.in_area("output")
            outputs = [realized[d.path] for d in declared if not d.is_scratch]
            area = self.session.area
            try:
                if commit is not None and isinstance(area, StagingArea):
                    # Staged now, checked as a promotion is; placed only once the caller has
                    # recorded the turn (`commit`, below): a turn whose ending is refused (its
                    # daemon lost the lease meanwhile) never reaches the workspace.
                    staged = await area.stage(outputs, self.session.workspace)
                    progress.promoted.extend(staged.outputs)
                else:
                    if before_promote is not None:
                        # the caller's last word (the daemon: is its lease still live?);
                        # raising stops the turn before anything reaches the workspace
                        await before_promote()
                    # The promoted files go onto `progress` once all are in place, also when
                    # the turn is cancelled meanwhile: the record of what reached the
                    # workspace is kept.
                    await area.promote(outputs, self.session.workspace, done=progress.promoted)
            except ConfinementLostError as exc:
                # The sandbox helper went away with the run's outputs: the attempt crashed
                # after all. The policy retries it (or ends the turn) like any interrupted one.
                attempts.pop()
                number = ran.record.attempt_number
                why = f"the outputs were lost before promotion: {exc}"
                hooks.last = crashed_run(
                    f"{CONFINEMENT_LOST}: {why}",
                    why,
                    number,
                    time.monotonic_ns() - ran.record.duration_ms * 1_000_000,
                    launcher=ran.record.launcher,
                )
                end = await loop(
                    interrupted=LoopRecord(
                        attempt=number, started_us=ran.record.started_us, instruction_id=name
                    )
                )
                assert end is not None
                continue
            except PromotionError as exc:
                v = capability_violation(
                    self.session.session_id,
                    turn,
                    "promote",
                    str(self.session.workspace),
                    "declared_outputs",
                    str(exc),
                )
                recorded.extend(await self._record_violation(turn, v))
                violations.append(v)
                decision = AttemptDecision(
                    Verdict.TERMINATE,
                    PROMOTION_FAILED,
                    str(exc),
                    fault_type=ExecutionFaultType.SECURITY_VIOLATION,
                )
            except OSError as exc:  # an I/O fault (disk full ...), not a violation: nothing
                # was promoted (promotion is all or nothing); a full disk is for a person
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                decision = AttemptDecision(
                    Verdict.ESCALATE if full else Verdict.TERMINATE,
                    PROMOTION_IO_FAILED,
                    f"promotion failed: {exc}",
                    fault_type=(
                        ExecutionFaultType.RESOURCE_EXHAUSTED if full else ExecutionFaultType.CRASH
                    ),
                )
            break
        if decision.record_entropy and entropy_detector is not None and phase is not None:
            entropy_detector.record(
                ToolCall(
                    id=f"{self.session.session_id}#{turn}",
                    name=argv[0],
                    arguments={"argv": list(argv)},
                ),
                phase,
            )
        status = _status(decision, last_outcome, bool(violations))
        last = attempts[-1]
        result = TurnResult(
            session_id=self.session.session_id,
            turn_number=turn,
            status=status,
            exit_code=last.exit_code,
            fault_type=None if decision.fault_type is None else decision.fault_type.value,
            verdict=decision.verdict.value,
            reason_code=decision.reason_code,
            reason=decision.reason,
            attempts=tuple(attempts),
            realized_writes=last.realized_writes,
            violations=tuple(violations),
            promoted_outputs=tuple(progress.promoted),
            duration_ms=ms_since(start_ns),
            enforcement=dict(levels),
            stdout=last.stdout,
            stderr=last.stderr,
        )
        sealed = await self._record(
            turn,
            request,
            result,
            recorded,
            declared=declared,
            header=header,
            seal_only=self.caller_commits,
        )
        if sealed is not None:
            result = dataclasses.replace(result, pending_lines=sealed)
        if commit is not None:
            await self._commit_then_place(commit, result, staged)
        _log.info(
            "turn_finished",
            session_id=self.session.session_id,
            turn_number=turn,
            status=status,
            reason_code=result.reason_code,
            duration_ms=result.duration_ms,
        )
        return result


def _plain(value: object) -> object:
    if isinstance(value, DeclaredOutput):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return repr(value)


def _scratch_writes(
    declared: Sequence[DeclaredOutput], writes: Sequence[RealizedWrite]
) -> list[dict[str, object]]:
    """The files a scratch declaration allowed (recorded in evidence, never promoted)."""
    compared = compare_surface(declared, ((w.area, w.path) for w in writes))
    by_key = {(w.area, w.path): w for w in writes}
    return [
        {**by_key[(area, path)].to_dict(), "declared_as": pattern}
        for area, path, pattern in compared.scratch
    ]


def _violations_of(entry: LedgerEntry) -> list[dict[str, object]]:
    items = entry.get("capability_violations", [])
    if not isinstance(items, (list, tuple)):
        return []
    return [dict(v) for v in items if isinstance(v, Mapping)]


def _with_decision(
    record: ProcessAttempt, outcome: AttemptOutcome, decision: AttemptDecision
) -> ProcessAttempt:
    from dataclasses import replace

    return replace(
        record,
        verdict=decision.verdict.value,
        reason_code=decision.reason_code,
        reason=decision.reason,
        delay_ms=decision.delay_ms,
        fault_type=(
            outcome.fault_type.value if outcome.fault_type is not None else record.fault_type
        ),
    )


def _status(decision: AttemptDecision, outcome: AttemptOutcome, violated: bool) -> TurnStatus:
    if violated:
        return "violation"
    if decision.verdict is Verdict.SUCCEED:
        return "succeeded"
    if decision.verdict is Verdict.EXHAUSTED:
        return "exhausted"
    if decision.verdict is Verdict.ESCALATE:
        return "escalated"
    if outcome.fault_type is ExecutionFaultType.TIMEOUT:
        return "timeout"
    if outcome.kind is OutcomeKind.FAILURE:
        return "failed"
    return "terminated"
