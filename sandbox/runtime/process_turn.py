"""A process turn from request to ledger entries: checks, attempts, promotion, records.

`ProcessTurn` is the front that runs one turn in order and composes its pieces, each in its
own module:

* ``request_checks``: before anything runs, the request is checked (``argv``, the one
  ``declared_outputs`` parser of ``sandbox.policy.declarations``, the executable and every
  declared destination against the capabilities); a refused request is a *rejected* turn.
* ``turn_progress``: the attempts go through THE attempt loop
  (``sandbox.policy.attempt_loop.run_attempts``): its runner is one confined run
  (``sandbox.runtime.attempt``), its hooks keep the turn's progress and log; time and sleep
  are injected here, at the edge.
* ``promotion``: on SUCCEED the declared outputs are promoted into the workspace (or staged,
  and placed once the caller recorded the turn).
* ``turn_ledger``: both ledger entries are written for every turn, also one cut short by
  cancellation or an error; in the daemon's mode (``caller_commits``) the normal ending's pair
  is sealed for the caller's store instead, and a turn cut short is left to the caller to
  record.
* ``turn_result``: what the turn ends with (`TurnResult`, its status, the reason codes).

Then the session's sandbox dirs are emptied (nothing a turn wrote stays there after it). The
names importers know from here (``TurnResult``, the reason codes, ``check_request`` ...) are
re-exported.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import structlog

from sandbox.errors import (
    CapabilityViolation,
    ConfinementLostError,
    DeclarationError,
    SandboxUnavailableError,
)
from sandbox.policy.attempt_loop import AttemptReport, run_attempts
from sandbox.policy.attempt_record import AttemptRecord as LoopRecord
from sandbox.policy.attempts import AgentPhase, RetryOptions, Verdict
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.retry_protocol import EntropyDetector, ToolCall
from sandbox.promote import PromotionError
from sandbox.prompt_header import PromptHeader
from sandbox.runs import ConfinedRun, crashed_run, ms_since
from sandbox.runtime.attempt import SPAWN_FAILED
from sandbox.runtime.confined_area import ConfinedArea
from sandbox.runtime.promotion import Promotion, io_failed, refused
from sandbox.runtime.request_checks import check_request, parse_declared_outputs
from sandbox.runtime.turn_ledger import TurnLedger, digest
from sandbox.runtime.turn_progress import ProcessHooks, TurnProgress
from sandbox.runtime.turn_result import (
    CAPABILITY_REJECTED,
    CONFINEMENT_LOST,
    DECLARATION_INVALID,
    PROMOTION_FAILED,
    PROMOTION_IO_FAILED,
    SANDBOX_UNAVAILABLE,
    TURN_CANCELLED,
    TURN_ERROR,
    TurnResult,
    TurnStatus,
    turn_status,
)
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


def _now_us() -> int:
    return time.time_ns() // 1000


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
        self.progress = TurnProgress(request={"argv": list(argv)})
        #: the turn's entries in the session's ledgers (``ledger.written``: both are made)
        self.ledger = TurnLedger(
            session.ledgers,
            session_id=session.session_id,
            turn=turn,
            caller_commits=caller_commits,
        )

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
            if not self.ledger.written and not self.caller_commits:
                with anyio.CancelScope(shield=True):
                    await self.ledger.aborted(
                        progress, exc, start_ns, levels=self.session.runtime.levels
                    )
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

    async def _unavailable(
        self,
        request: dict[str, object],
        start_ns: int,
        exc: SandboxUnavailableError,
        levels: Mapping[str, str],
    ) -> TurnResult:
        """Record a turn refused because a confinement mechanism is missing; the result when
        the caller ends the turn from it, else *exc* again."""
        rejected = await self.ledger.rejected(
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

    async def _run(
        self,
        progress: TurnProgress,
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
            return await self._unavailable(request, start_ns, exc, levels)
        try:
            exe, declared = check_request(self.session, argv, declared_outputs, turn)
        except DeclarationError as exc:
            return await self.ledger.rejected(
                request,
                start_ns,
                reason_code=DECLARATION_INVALID,
                reason=str(exc),
                violation=None,
                levels=levels,
            )
        except CapabilityViolation as exc:
            return await self.ledger.rejected(
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
            return await self._unavailable(request, start_ns, exc, levels)
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
        hooks = ProcessHooks(self.session.session_id, turn, progress)
        promotion = Promotion(
            self.session.area,
            self.session.workspace,
            promoted=progress.promoted,
            session_id=self.session.session_id,
            turn=turn,
        )

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
                recorded.extend(await self.ledger.record_violation(v))
                violations.append(v)
            hooks.last = run
            return AttemptReport(
                outcome=run.outcome, payload=run, duration_ms=run.record.duration_ms
            )

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
        while True:
            decision = end.decision
            last_outcome = end.outcome
            ran = end.report.payload if end.report is not None else hooks.last
            assert ran is not None
            hooks.finished(ran, decision)
            if decision.verdict is not Verdict.SUCCEED:
                break
            realized = ran.surface.in_area("output")
            outputs = [realized[d.path] for d in declared if not d.is_scratch]
            try:
                await promotion.promote(
                    outputs, staging=commit is not None, before_promote=before_promote
                )
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
                v = promotion.violation(exc)
                recorded.extend(await self.ledger.record_violation(v))
                violations.append(v)
                decision = refused(exc)
            except OSError as exc:  # an I/O fault (disk full ...), not a violation
                decision = io_failed(exc)
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
        status = turn_status(decision, last_outcome, bool(violations))
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
        sealed = await self.ledger.record(
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
            await promotion.commit_then_place(commit, result)
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
