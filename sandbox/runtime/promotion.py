"""The promotion of a succeeded turn's declared outputs into the workspace (`Promotion`), and
what a promotion that failed makes of the turn.

Apart from `process_turn` because promotion has its own two ways and their order: promoted at
once (after the caller's last word, ``before_promote``), or staged beside the destinations,
then placed only once the caller recorded the turn (``commit``) and discarded when it refused.
What reached the workspace goes onto the turn's progress (the list handed in as *promoted*),
so a turn cut short still records it. How a failure is decided (`refused`, `io_failed`) is
pure; the checks themselves are `sandbox.promote`'s, run by the area.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import anyio.to_thread
import structlog

from sandbox.enumerate import RealizedWrite
from sandbox.errors import CapabilityViolation
from sandbox.policy.attempts import AttemptDecision, Verdict
from sandbox.policy.faults import ExecutionFaultType
from sandbox.promote import PromotedOutput, PromotionError, StagedOutputs
from sandbox.runtime.attempt import capability_violation
from sandbox.runtime.confined_area import ConfinedArea, StagingArea
from sandbox.runtime.turn_result import PROMOTION_FAILED, PROMOTION_IO_FAILED, TurnResult

__all__ = ["Promotion", "io_failed", "refused"]

#: the process turn's own logger: these are its events, wherever their code lives
_log = structlog.get_logger("sandbox.runtime.process_turn")


class Promotion:
    """The promotion of one turn's outputs: *area*'s own (`ConfinedArea.promote`), or staged
    (`StagingArea.stage`) when the caller records the turn before it is placed. ``staged`` is
    what waits for the caller's record."""

    __slots__ = ("_area", "_promoted", "_session_id", "_turn", "_workspace", "staged")

    def __init__(
        self,
        area: ConfinedArea,
        workspace: Path,
        *,
        promoted: list[PromotedOutput],
        session_id: str,
        turn: int,
    ) -> None:
        self._area = area
        self._workspace = workspace
        self._promoted = promoted
        self._session_id = session_id
        self._turn = turn
        self.staged: StagedOutputs | None = None

    async def promote(
        self,
        outputs: Sequence[RealizedWrite],
        *,
        staging: bool,
        before_promote: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Promote *outputs* (all or nothing), or with *staging* stage them when the area can.

        Raises what the area raises: `PromotionError` (refused), ``OSError`` (an I/O fault),
        `ConfinementLostError` (the sandbox helper went away with the outputs), or what
        *before_promote* raises (nothing reached the workspace then)."""
        area = self._area
        if staging and isinstance(area, StagingArea):
            # Staged now, checked as a promotion is; placed only once the caller has
            # recorded the turn (`commit_then_place`): a turn whose ending is refused (its
            # daemon lost the lease meanwhile) never reaches the workspace.
            self.staged = await area.stage(outputs, self._workspace)
            self._promoted.extend(self.staged.outputs)
            return
        if before_promote is not None:
            # the caller's last word (the daemon: is its lease still live?);
            # raising stops the turn before anything reaches the workspace
            await before_promote()
        # The promoted files go onto the progress once all are in place, also when
        # the turn is cancelled meanwhile: the record of what reached the
        # workspace is kept.
        await area.promote(outputs, self._workspace, done=self._promoted)

    def violation(self, exc: PromotionError) -> CapabilityViolation:
        """The violation a refused promotion is recorded as."""
        return capability_violation(
            self._session_id,
            self._turn,
            "promote",
            str(self._workspace),
            "declared_outputs",
            str(exc),
        )

    async def commit_then_place(
        self, commit: Callable[[TurnResult], Awaitable[None]], result: TurnResult
    ) -> None:
        """The caller records the turn (its durable step: the ending with both ledger lines),
        then the staged outputs go into place; a record refused (the caller lost its lease on
        the turn) discards them, so nothing of the turn reaches the workspace. Placing is only
        renames: once the turn is recorded it happens even when the caller is cancelled."""
        staged = self.staged
        if staged is not None and staged.empty:
            staged = None  # nothing to place or discard: no worker thread after the commit
        try:
            await commit(result)
        except BaseException:
            if staged is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(staged.discard)
                self._promoted.clear()
            raise
        if staged is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(staged.place)
            except OSError as exc:  # recorded already: say so loudly, the turn stands
                _log.error(
                    "outputs_not_placed",
                    session_id=self._session_id,
                    turn_number=self._turn,
                    error=str(exc),
                )


def refused(exc: PromotionError) -> AttemptDecision:
    """What a refused promotion (a security violation) makes of the turn: it ends."""
    return AttemptDecision(
        Verdict.TERMINATE,
        PROMOTION_FAILED,
        str(exc),
        fault_type=ExecutionFaultType.SECURITY_VIOLATION,
    )


def io_failed(exc: OSError) -> AttemptDecision:
    """What an I/O fault during promotion (disk full ...) makes of the turn: not a violation,
    and nothing was promoted (promotion is all or nothing); a full disk is for a person."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return AttemptDecision(
        Verdict.ESCALATE if full else Verdict.TERMINATE,
        PROMOTION_IO_FAILED,
        f"promotion failed: {exc}",
        fault_type=(ExecutionFaultType.RESOURCE_EXHAUSTED if full else ExecutionFaultType.CRASH),
    )
