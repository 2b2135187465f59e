"""A session's two ledgers (seed 004 FR-RT-006/007/017/018).

``<root>/planes/<tier>/sessions/<sid>/ledger/exec.jsonl`` (ledger id ``<sid>/exec``) and
``.../evidence.jsonl`` (``<sid>/evidence``). Both are created at session start with a
``session_opened`` entry; every turn writes one entry to each, and the pair is made durable in one
sync round before `record_turn` returns (`turn_lines`: the caller's store seals the pair and
makes it durable).

`SessionLedgers` is the front the daemon and the sandbox hold: it creates, reopens and adopts a
session's ledgers and spells out, for type checking, each way of writing a turn (blocking, async,
sealed for a caller's commit). What it writes is built in `records`; where the ledgers live is
`sessiondir`; writing both and making them durable as one is `pair`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from ledger.clock import Clock, wall_clock_us
from ledger.entries import LedgerEntry, SealedLine
from ledger.pair import LedgerPair
from ledger.pending import PendingLines
from ledger.records import opened_record, turn_records, violation_record
from ledger.sessiondir import both_ledgers_exist, session_dir_for
from ledger.syncer import Syncer
from ledger.writer import LedgerWriter

__all__ = ["SessionLedgers", "both_ledgers_exist", "session_dir_for"]


class SessionLedgers:
    """The exec and evidence ledgers of one session (use `create` or `open`)."""

    def __init__(
        self,
        pair: LedgerPair,
        *,
        session_dir: Path,
        session_id: str,
        tier: str,
        work_order_id: str | None = None,
        clock: Clock = wall_clock_us,
    ) -> None:
        self.session_dir = session_dir
        self.session_id = session_id
        self.tier = tier
        self.work_order_id = work_order_id
        self._pair = pair
        self._clock = clock

    @classmethod
    def create(
        cls,
        *,
        root: Path,
        tier: str,
        session_id: str,
        syncer: Syncer | None = None,
        work_order_id: str | None = None,
        clock: Clock = wall_clock_us,
        opened_extra: Mapping[str, object] | None = None,
    ) -> SessionLedgers:
        """Create both ledgers of a new session, each starting with a ``session_opened`` entry.

        Raises ``FileExistsError`` if either ledger already exists.
        """
        session_dir = session_dir_for(root, tier, session_id)
        pair = LedgerPair.open(
            session_dir, session_id=session_id, syncer=syncer, clock=clock, files="new"
        )
        ledgers = cls(
            pair,
            session_dir=session_dir,
            session_id=session_id,
            tier=tier,
            work_order_id=work_order_id,
            clock=clock,
        )
        try:
            record = opened_record(
                session_id=session_id, tier=tier, work_order_id=work_order_id, extra=opened_extra
            )
            pair.write(record, dict(record))
        except BaseException:
            ledgers.close()
            raise
        return ledgers

    @classmethod
    def open(
        cls,
        *,
        root: Path,
        tier: str,
        session_id: str,
        syncer: Syncer | None = None,
        work_order_id: str | None = None,
        clock: Clock = wall_clock_us,
    ) -> SessionLedgers:
        """Reopen an existing session's ledgers (daemon restart); both must exist."""
        session_dir = session_dir_for(root, tier, session_id)
        pair = LedgerPair.open(
            session_dir, session_id=session_id, syncer=syncer, clock=clock, files="existing"
        )
        return cls(
            pair,
            session_dir=session_dir,
            session_id=session_id,
            tier=tier,
            work_order_id=work_order_id,
            clock=clock,
        )

    @classmethod
    def adopt(
        cls,
        *,
        root: Path,
        tier: str,
        session_id: str,
        lines: Iterable[SealedLine],
        clock: Clock = wall_clock_us,
    ) -> int:
        """Write a session's ledgers from the lines a shared store anchored (a daemon taking the
        session over from another host): missing files are created, lines the files already
        hold are skipped, every other line must continue the chain (`LedgerWriter.restore`).
        Returns how many lines were appended; the ledgers are closed again (open them with
        `open`)."""
        session_dir = session_dir_for(root, tier, session_id)
        pair = LedgerPair.open(
            session_dir, session_id=session_id, syncer=None, clock=clock, files="any"
        )
        try:
            return pair.restore(lines)
        finally:
            pair.close()

    # -- writers, paths and gate ---------------------------------------------------------------

    @property
    def exec(self) -> LedgerWriter:
        """The writer of ``exec.jsonl``."""
        return self._pair.exec

    @property
    def evidence(self) -> LedgerWriter:
        """The writer of ``evidence.jsonl``."""
        return self._pair.evidence

    @property
    def exec_path(self) -> Path:
        """``.../ledger/exec.jsonl``."""
        return self.exec.path

    @property
    def evidence_path(self) -> Path:
        """``.../ledger/evidence.jsonl``."""
        return self.evidence.path

    def exists_both(self) -> bool:
        """FR-RT-018 gate: both ledger files exist."""
        return both_ledgers_exist(self.session_dir)

    # -- writing -------------------------------------------------------------------------------

    def record_turn(
        self,
        *,
        turn_number: int,
        query_hash: str,
        result_hash: str,
        status: str,
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        external_calls: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        work_order_id: str | None = None,
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """Write the turn's exec and evidence entries; return once both are durable."""
        return self._pair.write(
            *turn_records(
                session_id=self.session_id,
                turn_number=turn_number,
                query_hash=query_hash,
                result_hash=result_hash,
                status=status,
                declared_reads=declared_reads,
                declared_writes=declared_writes,
                external_calls=external_calls,
                capability_violations=capability_violations,
                work_order_id=self._work_order(work_order_id),
                exec_extra=exec_extra,
                evidence_extra=evidence_extra,
            )
        )

    def seal_turn(
        self,
        *,
        turn_number: int,
        query_hash: str,
        result_hash: str,
        status: str,
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        external_calls: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> tuple[SealedLine, SealedLine]:
        """Seal and hold the turn's exec and evidence entries now (`turn_lines`, sealed at
        once); the caller releases them after its commit."""
        exec_line, evidence_line = self.turn_lines(
            turn_number=turn_number,
            query_hash=query_hash,
            result_hash=result_hash,
            status=status,
            declared_reads=declared_reads,
            declared_writes=declared_writes,
            external_calls=external_calls,
            capability_violations=capability_violations,
            exec_extra=exec_extra,
            evidence_extra=evidence_extra,
        ).seal()
        return exec_line, evidence_line

    def turn_lines(
        self,
        *,
        turn_number: int,
        query_hash: str,
        result_hash: str,
        status: str,
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        external_calls: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> PendingLines:
        """The turn's exec and evidence entries, checked but *not* sealed: for a caller whose
        own store commits the two lines in its transaction (the daemon's turn store). The store
        seals them (`PendingLines.seal`) only once the ending's fence has held, in the
        transaction that commits it, and withdraws them if that transaction fails; a refused
        ending never takes a seq. Sealed lines are held out of the files until the caller's
        `release` (after the commit), so the files only ever hold what the store committed: a
        crash leaves both lines of a turn or neither. The files catch up with `sync`, and after
        a crash from the store (`LedgerWriter.restore`).
        """
        return self._pair.pending(
            *turn_records(
                session_id=self.session_id,
                turn_number=turn_number,
                query_hash=query_hash,
                result_hash=result_hash,
                status=status,
                declared_reads=declared_reads,
                declared_writes=declared_writes,
                external_calls=external_calls,
                capability_violations=capability_violations,
                work_order_id=self.work_order_id,
                exec_extra=exec_extra,
                evidence_extra=evidence_extra,
            )
        )

    def evidence_lines(self, record: Mapping[str, object]) -> PendingLines:
        """One evidence entry, checked and not sealed (as `turn_lines` does a pair): for a turn
        whose exec entry survived a crash without its evidence entry, rebuilt by the caller."""
        return PendingLines(((self.evidence, self.evidence.prepare(record)),))

    def release(self, lines: Iterable[SealedLine]) -> None:
        """The caller's store committed these sealed lines: they may go to the files now (with
        the next `flush` or `sync`). Lines of other ledgers are ignored."""
        self._pair.release(lines)

    def flush(self) -> None:
        """Write both files' queued lines now, without syncing (see `LedgerWriter.flush`)."""
        self._pair.flush()

    def sync(self) -> tuple[int, int]:
        """Make everything written to both files durable (one sync round; blocking), up to
        the first line still held for its commit; returns the durable ``(exec seq, evidence
        seq)``."""
        return self._pair.sync()

    def record_violation(
        self,
        *,
        turn_number: int,
        operation: str,
        target: str,
        capability: str,
        detail: str = "",
        work_order_id: str | None = None,
        timestamp_us: int | None = None,
    ) -> LedgerEntry:
        """Write a ``capability_violation`` evidence entry now (durable on return); lines held
        for a commit go out with it, on both ledgers, the exec ledger's first and durable
        before it (a crash leaves a turn's exec entry without its evidence entry, which
        recovery rebuilds, never the reverse)."""
        self._pair.let_exec_out()
        return self.evidence.append(
            violation_record(
                session_id=self.session_id,
                turn_number=turn_number,
                operation=operation,
                target=target,
                capability=capability,
                detail=detail,
                work_order_id=self._work_order(work_order_id),
                timestamp_us=self._clock() if timestamp_us is None else timestamp_us,
            )
        )

    def checkpoint(self) -> tuple[LedgerEntry, LedgerEntry]:
        """Append a checkpoint to each ledger (HO2)."""
        return self._pair.checkpoint()

    def close(self) -> None:
        """Close both writers (everything written is made durable first)."""
        self._pair.close()

    def __enter__(self) -> SessionLedgers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- async wrappers (the durable wait runs in a worker thread) -------------------------------

    async def arecord_turn(
        self,
        *,
        turn_number: int,
        query_hash: str,
        result_hash: str,
        status: str,
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        external_calls: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        work_order_id: str | None = None,
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """`record_turn` for async callers.

        Both lines are queued in the calling thread; the task then awaits durability (see
        `await_durable`: with a `GroupSyncer` under asyncio without occupying a worker thread,
        so many turns share one sync batch).
        """
        return await self._pair.awrite(
            *turn_records(
                session_id=self.session_id,
                turn_number=turn_number,
                query_hash=query_hash,
                result_hash=result_hash,
                status=status,
                declared_reads=declared_reads,
                declared_writes=declared_writes,
                external_calls=external_calls,
                capability_violations=capability_violations,
                work_order_id=self._work_order(work_order_id),
                exec_extra=exec_extra,
                evidence_extra=evidence_extra,
            )
        )

    async def arecord_violation(
        self,
        *,
        turn_number: int,
        operation: str,
        target: str,
        capability: str,
        detail: str = "",
        work_order_id: str | None = None,
        timestamp_us: int | None = None,
    ) -> LedgerEntry:
        """`record_violation` for async callers (see `LedgerWriter.aappend`)."""
        await self._pair.alet_exec_out()
        return await self.evidence.aappend(
            violation_record(
                session_id=self.session_id,
                turn_number=turn_number,
                operation=operation,
                target=target,
                capability=capability,
                detail=detail,
                work_order_id=self._work_order(work_order_id),
                timestamp_us=self._clock() if timestamp_us is None else timestamp_us,
            )
        )

    async def acheckpoint(self) -> tuple[LedgerEntry, LedgerEntry]:
        """`checkpoint` in a worker thread."""
        import anyio.to_thread  # lazy: keeps `import ledger` light for the CLI

        return await anyio.to_thread.run_sync(self.checkpoint)

    async def aclose(self) -> None:
        """`close` in a worker thread."""
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.close)

    # -- internals ---------------------------------------------------------------------------

    def _work_order(self, work_order_id: str | None) -> str | None:
        """The work order a record names: the caller's, else the session's."""
        return self.work_order_id if work_order_id is None else work_order_id
