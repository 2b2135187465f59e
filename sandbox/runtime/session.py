"""A session of the sandbox runtime (seed 004): its package, ledgers, confined area and turns.

A `Session` ties the pieces together: the `Runtime` that opened it (runtime.py), its confined
area (area.py: directories, uid, Landlock ruleset, cgroup), the process turns run in it
(process_turn.py: checks, THE attempt loop over confined runs from attempt.py, promotion,
ledger entries) and the ledger entries of instruction turns the daemon records for it.
docs/sandbox.md describes the threat model and what each mechanism does and does not stop.

The names importers know from the former single module (``RuntimeConfig``, ``TurnResult``,
``ProcessAttempt``, ``DeclaredOutput`` ...) are re-exported here; ``Runtime`` is imported from
`sandbox.runtime` (this module sits below it and sees it through `view.RuntimeView`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import anyio

from ledger import LedgerEntry, SealedLine, SessionLedgers
from ledger.pending import PendingLines
from sandbox.errors import CapabilityViolation
from sandbox.packages import Package
from sandbox.policy.attempts import AgentPhase, RetryOptions
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.retry_protocol import EntropyDetector
from sandbox.prompt_header import PromptHeader, build_prompt_header
from sandbox.runs import ProcessAttempt
from sandbox.runtime.area import session_capabilities
from sandbox.runtime.config import (
    DEFAULT_LOADER_PATHS,
    DEFAULT_SYSTEM_READ_PATHS,
    RuntimeConfig,
)
from sandbox.runtime.confined_area import ConfinedArea
from sandbox.runtime.evidence import EvidenceRef, store_evidence
from sandbox.runtime.process_turn import (
    ProcessTurn,
    TurnResult,
    TurnStatus,
    check_request,
    digest,
    parse_declared_outputs,
)
from sandbox.runtime.view import RuntimeView

__all__ = [
    "DEFAULT_LOADER_PATHS",
    "DEFAULT_SYSTEM_READ_PATHS",
    "DeclaredOutput",
    "ProcessAttempt",
    "RuntimeConfig",
    "Session",
    "TurnResult",
    "TurnStatus",
    "parse_declared_outputs",
]


class Session:
    """One session: its package, ledgers, sandbox dirs and the turns run in it.

    The session owns *ledgers* from construction on: ``close`` closes them, and so does a
    constructor that fails (which also returns the session's uid to the pool).
    """

    def __init__(
        self,
        runtime: RuntimeView,
        package: Package,
        ledgers: SessionLedgers,
        *,
        workspace: Path,
        work_order_id: str | None,
    ) -> None:
        self.runtime = runtime
        self.package = package
        self.ledgers = ledgers
        self.session_id = ledgers.session_id
        self.tier = ledgers.tier
        self.work_order_id = work_order_id
        self.workspace = Path(os.path.abspath(workspace))
        self.next_turn_number = 1
        self._lock = anyio.Lock()
        self._closed = False
        try:
            self.capabilities = session_capabilities(runtime, package, self.workspace)
        except BaseException:
            ledgers.close()  # the session owns its ledgers from the start
            raise
        self.area: ConfinedArea = runtime.new_area(
            self.session_id, package, self.capabilities, self.workspace
        )
        try:
            self.area.open()
        except BaseException:
            self.close()  # ... and its uid
            raise

    # -- the confined area ---------------------------------------------------------------------

    @property
    def tmp_dir(self) -> Path:
        """``tmp/<sid>``: the turn's HOME and TMPDIR."""
        return self.area.tmp_dir

    @property
    def output_dir(self) -> Path:
        """``output/<sid>``: where the turn writes its declared outputs."""
        return self.area.output_dir

    @property
    def uid(self) -> int:
        """The session's unprivileged uid (-1 when the runtime is not root)."""
        return self.area.uid

    @property
    def gid(self) -> int:
        """The session's gid (-1 when the runtime is not root)."""
        return self.area.gid

    @property
    def network_granted(self) -> bool:
        """Whether the manifest grants network access."""
        return self.package.capabilities.network

    # -- checks before a turn -----------------------------------------------------------------

    def check_turn_request(
        self,
        argv: Sequence[str],
        declared_outputs: object,
        *,
        turn_number: int | None = None,
        record: bool = True,
    ) -> None:
        """Check a request for the daemon's intake; a violation is recorded (durably: the
        evidence ledger's sync), then raised. With ``record=False`` nothing is written: the
        check alone (a few ``stat`` calls), for a caller that records a violation itself
        (`record_refused_request`, off its event loop)."""
        try:
            check_request(self, argv, declared_outputs, turn_number or self.next_turn_number)
        except CapabilityViolation as exc:
            if record:
                self.record_refused_request(exc, turn_number=turn_number)
            raise

    def record_refused_request(
        self, violation: CapabilityViolation, *, turn_number: int | None = None
    ) -> None:
        """Write *violation* of a refused request to the evidence ledger, durably."""
        self.ledgers.record_violation(
            turn_number=turn_number or self.next_turn_number,
            operation=violation.operation,
            target=violation.target,
            capability=violation.capability,
            detail=violation.detail,
        )

    def prompt_header(
        self,
        *,
        turn_number: int,
        declared_inputs: Sequence[str] = (),
        declared_outputs: Sequence[Mapping[str, str]] = (),
    ) -> PromptHeader:
        """The prompt header of a turn (inputs hashed relative to the workspace)."""
        return build_prompt_header(
            session_id=self.session_id,
            turn_number=turn_number,
            declared_inputs=declared_inputs,
            declared_outputs=declared_outputs,
            base=self.workspace,
            work_order_id=self.work_order_id,
        )

    # -- turns -----------------------------------------------------------------------------------

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
        delay: Callable[[float], Awaitable[None]] = anyio.sleep,
        before_promote: Callable[[], Awaitable[None]] | None = None,
        commit: Callable[[TurnResult], Awaitable[None]] | None = None,
        entropy_detector: EntropyDetector | None = None,
        ledger_commit: Literal["sync", "caller"] = "sync",
        first_attempt: int = 1,
    ) -> TurnResult:
        """Run one process turn (all attempts); both ledgers get their entries in every case.

        ``first_attempt``: the number of its first attempt here, when the turn already had
        attempts (the daemon runs it again after a restart or a takeover): the attempts, their
        log events and ledger entries and the policy's count (``options.max_attempts`` is the
        turn's whole budget) go on from it.

        ``delay`` sleeps a retry's backoff (it may refuse to go on by raising);
        ``commit``: the caller's durable step, awaited with the result once its entries are
        made (``ledger_commit="caller"``): the declared outputs are staged before it and placed
        into the workspace only after it returned; when it raises they are discarded (a turn
        whose ending the caller's store refused never reaches the workspace). Where the area
        cannot stage (the sandbox helper's), ``before_promote`` is awaited right before the
        outputs are promoted instead (raising stops the turn there).

        ``ledger_commit="caller"``: the normal ending's two entries are checked but not
        sealed; they are in ``TurnResult.pending_lines`` for the caller's store to seal once the
        ending's fence held and commit with it (the daemon's one durable step), a rejection's
        as well
        (``SandboxUnavailableError`` too becomes a rejected result); a turn cut short
        (cancelled, an error) is not recorded here: the caller records its ending.

        A request that is malformed or not allowed is *rejected* before it runs (status
        ``rejected``; ``violations`` holds the recorded ``CapabilityViolation``).
        ``SandboxUnavailableError`` is raised (after recording the rejected turn) when the
        strict enforcement level cannot be met. The session runs one turn at a time.
        """
        async with self._lock:
            turn = turn_number if turn_number is not None else self.next_turn_number
            self.next_turn_number = max(self.next_turn_number, turn + 1)
            return await ProcessTurn(
                self, turn, argv, caller_commits=ledger_commit == "caller"
            ).execute(
                argv,
                declared_outputs=declared_outputs,
                declared_inputs=declared_inputs,
                phase=phase,
                timeout_ms=timeout_ms,
                options=options or RetryOptions(),
                delay=delay,
                entropy_detector=entropy_detector,
                first_attempt=first_attempt,
                before_promote=before_promote,
                commit=commit,
            )

    async def record_instruction_turn(
        self,
        *,
        turn_number: int,
        instruction: Mapping[str, object],
        result: Mapping[str, object],
        status: str,
        external_calls: Iterable[object] = (),
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """Write both ledger entries of an executor (instruction) turn."""
        self.next_turn_number = max(self.next_turn_number, turn_number + 1)
        return await self.ledgers.arecord_turn(
            turn_number=turn_number,
            query_hash=digest(instruction),
            result_hash=digest(result),
            status=status,
            declared_reads=declared_reads,
            declared_writes=declared_writes,
            external_calls=external_calls,
            capability_violations=capability_violations,
            exec_extra=exec_extra,
            evidence_extra=evidence_extra,
        )

    async def store_evidence(self, data: bytes) -> EvidenceRef:
        """Keep an executor's evidence bytes under the session, content-addressed and durable
        (``<session dir>/evidence/<sha256>``, see `sandbox.runtime.evidence`)."""
        return await anyio.to_thread.run_sync(store_evidence, self.ledgers.session_dir, data)

    @property
    def ledger_ids(self) -> tuple[str, str]:
        """``(exec ledger id, evidence ledger id)``."""
        return self.ledgers.exec.ledger_id, self.ledgers.evidence.ledger_id

    @property
    def exec_ledger_path(self) -> Path:
        return self.ledgers.exec_path

    def evidence_lines(self, record: Mapping[str, object]) -> PendingLines:
        """One evidence entry, checked, for the caller's store to seal and commit (see
        `SessionLedgers.evidence_lines`)."""
        return self.ledgers.evidence_lines(record)

    def release_ledgers(self, committed: Iterable[SealedLine]) -> None:
        """The caller's store committed these sealed lines: they may go to the files (with the
        next `flush_ledgers` or sync)."""
        self.ledgers.release(committed)

    def flush_ledgers(self, committed: Iterable[SealedLine] = ()) -> None:
        """Release *committed* (sealed lines the caller's store has committed), then write the
        queued lines to both files up to the first one still held, without syncing."""
        self.ledgers.release(committed)
        self.ledgers.flush()

    def sync_ledgers(self) -> tuple[int, int]:
        """Make both ledger files durable up to what was written (blocking); their seqs."""
        return self.ledgers.sync()

    def restore_ledgers(self, lines: Sequence[SealedLine]) -> int:
        """Write back lines a store kept but the files lost in a crash (see
        `LedgerWriter.restore`); how many were appended."""
        exec_id, evidence_id = self.ledger_ids
        appended = self.ledgers.exec.restore(x for x in lines if x.ledger_id == exec_id)
        appended += self.ledgers.evidence.restore(x for x in lines if x.ledger_id == evidence_id)
        return appended

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the ledgers and release the session's fds, cgroup and uid (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.area.close()
        self.ledgers.close()

    async def aclose(self) -> None:
        """``close`` in a worker thread (the ledgers sync on close)."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
