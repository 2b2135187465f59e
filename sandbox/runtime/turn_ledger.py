"""The ledger entries of one process turn: its violations' evidence entries, and the turn's
exec and evidence pair, written for every way it ends (`TurnLedger`).

Apart from `process_turn` because what a turn writes to its ledgers changes with the ledger's
format (the fields of the pair, their hashes, the scratch writes in evidence), not with how
the turn runs; and because the endings that end in nothing but entries (a rejected request, a
turn cut short) are built here, next to the pair they write. In the daemon's mode
(``caller_commits``) a normal ending's and a rejection's pair is checked and handed back
unsealed, for the caller's store to seal with the ending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from ledger import LedgerEntry
from ledger.chain import content_hash
from ledger.pending import PendingLines
from sandbox.enumerate import RealizedWrite
from sandbox.errors import CapabilityViolation
from sandbox.policy.attempts import Verdict
from sandbox.policy.declarations import DeclaredOutput, compare_surface
from sandbox.policy.faults import ExecutionFaultType
from sandbox.prompt_header import PromptHeader
from sandbox.runs import ms_since
from sandbox.runtime.turn_progress import TurnProgress
from sandbox.runtime.turn_result import TURN_CANCELLED, TURN_ERROR, TurnResult

if TYPE_CHECKING:
    from ledger import SessionLedgers

__all__ = ["TurnLedger", "digest"]

#: the process turn's own logger: these are its events, wherever their code lives
_log = structlog.get_logger("sandbox.runtime.process_turn")

#: a request's or result's hash in a turn entry (the ledger's one definition)
digest = content_hash


class TurnLedger:
    """The entries of one turn in its session's ledgers. ``written`` is True once the turn's
    pair is written (or sealed for the caller), so that nothing records it twice."""

    __slots__ = ("_caller_commits", "_ledgers", "_session_id", "_turn", "written")

    def __init__(
        self, ledgers: SessionLedgers, *, session_id: str, turn: int, caller_commits: bool
    ) -> None:
        self._ledgers = ledgers
        self._session_id = session_id
        self._turn = turn
        self._caller_commits = caller_commits
        self.written = False

    async def record_violation(self, violation: CapabilityViolation) -> list[dict[str, object]]:
        """Write a violation's evidence entry now; return it as the turn entry lists it."""
        entry = await self._ledgers.arecord_violation(
            turn_number=self._turn,
            operation=violation.operation,
            target=violation.target,
            capability=violation.capability,
            detail=violation.detail,
        )
        return _violations_of(entry)

    async def record(
        self,
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
            "turn_number": self._turn,
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
            lines = self._ledgers.turn_lines(**fields)
        else:
            await self._ledgers.arecord_turn(**fields)
        self.written = True
        return lines

    async def rejected(
        self,
        request: dict[str, object],
        start_ns: int,
        *,
        reason_code: str,
        reason: str,
        violation: CapabilityViolation | None,
        levels: Mapping[str, str],
    ) -> TurnResult:
        """Record a request refused before it ran (with its violation's entry, if any) and
        return the *rejected* result (its pair unsealed in it when the caller commits)."""
        violations: tuple[CapabilityViolation, ...] = ()
        recorded: list[dict[str, object]] = []
        if violation is not None:
            recorded = await self.record_violation(violation)
            violations = (violation,)
        result = TurnResult(
            session_id=self._session_id,
            turn_number=self._turn,
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
        sealed = await self.record(
            request, result, recorded, declared=(), header=None, seal_only=self._caller_commits
        )
        if sealed is not None:  # the caller seals and commits them with the ending
            result = dataclasses.replace(result, pending_lines=sealed)
        _log.warning(
            "turn_rejected",
            session_id=self._session_id,
            turn_number=self._turn,
            reason_code=reason_code,
            reason=reason,
        )
        return result

    async def aborted(
        self,
        progress: TurnProgress,
        exc: BaseException,
        start_ns: int,
        *,
        levels: Mapping[str, str],
    ) -> None:
        """Both ledger entries for a turn cut short by cancellation or an internal error.

        The attempt's process tree is already dead (the attempt's cleanup runs shielded).
        The attempts, violations and promotions done before the abort are recorded with it.
        A failure to record is logged; it never replaces the original exception.
        """
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        result = TurnResult(
            session_id=self._session_id,
            turn_number=self._turn,
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
            enforcement=dict(levels),
        )
        try:
            await self.record(progress.request, result, progress.recorded, declared=(), header=None)
        except Exception as record_exc:  # never mask the original exception
            _log.error(
                "turn_record_failed",
                session_id=self._session_id,
                turn_number=self._turn,
                error=repr(record_exc),
            )


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
