"""A session's two ledgers (seed 004 FR-RT-006/007/017/018).

``<root>/planes/<tier>/sessions/<sid>/ledger/exec.jsonl`` (ledger id ``<sid>/exec``) and
``.../evidence.jsonl`` (``<sid>/evidence``). Both are created at session start with a
``session_opened`` entry; every turn writes one entry to each, and the pair is made durable in one
sync round before `record_turn` returns (`turn_lines`: the caller's store seals the pair and
makes it durable).

`SessionLedgers` is over 400 lines because the seed's turn entry has many fields and each way of
writing it (blocking, async, sealed for a caller's commit) spells them out for type checking;
the records themselves are built in one place (`_turn_records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from ledger.entries import (
    KIND_SESSION_OPENED,
    KIND_TURN,
    KIND_VIOLATION,
    LedgerEntry,
    SealedLine,
)
from ledger.errors import IntegrityError, LedgerRecordError
from ledger.files import make_dirs
from ledger.pending import PendingLines
from ledger.syncer import InlineSyncer, Syncable, Syncer, await_durable
from ledger.verify import session_ledger_paths
from ledger.writer import Clock, LedgerWriter, wall_clock_us

__all__ = ["SessionLedgers", "both_ledgers_exist", "session_dir_for"]


def _check_name(what: str, value: str) -> str:
    if (
        not value
        or value in {".", ".."}
        or "/" in value
        or "\\" in value
        or not value.isascii()
        or not value.isprintable()
        or any(char.isspace() for char in value)
    ):
        raise LedgerRecordError(what, f"{value!r} cannot name a directory")
    return value


def session_dir_for(root: Path, tier: str, session_id: str) -> Path:
    """``<root>/planes/<tier>/sessions/<sid>``."""
    return (
        Path(root)
        / "planes"
        / _check_name("tier", tier)
        / "sessions"
        / _check_name("session_id", session_id)
    )


def both_ledgers_exist(session_dir: Path) -> bool:
    """The FR-RT-018 gate: a valid session has both ``exec.jsonl`` and ``evidence.jsonl``."""
    return all(path.is_file() for path in session_ledger_paths(session_dir))


def _items(values: Iterable[object]) -> list[object]:
    return [dict(value) if isinstance(value, Mapping) else value for value in values]


def _merge(record: dict[str, object], extra: Mapping[str, object] | None) -> dict[str, object]:
    if extra:
        for key, value in extra.items():
            if key in record:
                raise LedgerRecordError(key, "conflicts with a field the session ledger sets")
            record[key] = value
    return record


class SessionLedgers:
    """The exec and evidence ledgers of one session (use `create` or `open`)."""

    def __init__(
        self,
        *,
        session_dir: Path,
        session_id: str,
        tier: str,
        exec_writer: LedgerWriter,
        evidence_writer: LedgerWriter,
        syncer: Syncer,
        work_order_id: str | None = None,
        clock: Clock = wall_clock_us,
    ) -> None:
        self.session_dir = session_dir
        self.session_id = session_id
        self.tier = tier
        self.exec = exec_writer
        self.evidence = evidence_writer
        self.work_order_id = work_order_id
        self._syncer = syncer
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
        exec_path, evidence_path = session_ledger_paths(session_dir)
        for path in (exec_path, evidence_path):
            if path.exists():
                raise FileExistsError(f"{path}: session ledger already exists")
        make_dirs(exec_path.parent)
        ledgers = cls._open_writers(
            session_dir,
            tier=tier,
            session_id=session_id,
            syncer=syncer,
            work_order_id=work_order_id,
            clock=clock,
            require_existing=False,
        )
        try:
            record: dict[str, object] = {
                "kind": KIND_SESSION_OPENED,
                "session_id": session_id,
                "tier": tier,
            }
            if work_order_id is not None:
                record["work_order_id"] = work_order_id
            _merge(record, opened_extra)
            ledgers._write_pair(record, dict(record))
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
        return cls._open_writers(
            session_dir,
            tier=tier,
            session_id=session_id,
            syncer=syncer,
            work_order_id=work_order_id,
            clock=clock,
            require_existing=True,
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
        make_dirs(session_ledger_paths(session_dir)[0].parent)
        ledgers = cls._open_writers(
            session_dir,
            tier=tier,
            session_id=session_id,
            syncer=None,
            work_order_id=None,
            clock=clock,
            require_existing=False,
        )
        try:
            kept = list(lines)
            exec_id, evidence_id = ledgers.exec.ledger_id, ledgers.evidence.ledger_id
            appended = ledgers.exec.restore(x for x in kept if x.ledger_id == exec_id)
            appended += ledgers.evidence.restore(x for x in kept if x.ledger_id == evidence_id)
        finally:
            ledgers.close()
        return appended

    @classmethod
    def _open_writers(
        cls,
        session_dir: Path,
        *,
        tier: str,
        session_id: str,
        syncer: Syncer | None,
        work_order_id: str | None,
        clock: Clock,
        require_existing: bool,
    ) -> SessionLedgers:
        exec_path, evidence_path = session_ledger_paths(session_dir)
        if require_existing:
            for path in (exec_path, evidence_path):
                if not path.is_file():
                    raise IntegrityError(
                        path, 0, None, "ledger missing: a session needs both ledgers"
                    )
        shared: Syncer = InlineSyncer() if syncer is None else syncer
        exec_writer = LedgerWriter(
            exec_path, ledger_id=f"{session_id}/exec", syncer=shared, clock=clock
        )
        try:
            evidence_writer = LedgerWriter(
                evidence_path, ledger_id=f"{session_id}/evidence", syncer=shared, clock=clock
            )
        except BaseException:
            exec_writer.close()
            raise
        return cls(
            session_dir=session_dir,
            session_id=session_id,
            tier=tier,
            exec_writer=exec_writer,
            evidence_writer=evidence_writer,
            syncer=shared,
            work_order_id=work_order_id,
            clock=clock,
        )

    # -- paths and gate ------------------------------------------------------------------------

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

    def _queue_pair(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> tuple[LedgerEntry, LedgerEntry]:
        # Validate both before writing either, so a bad record never leaves a turn in one
        # ledger only.
        exec_fields = self.exec.prepare(exec_record)
        evidence_fields = self.evidence.prepare(evidence_record)
        return self.exec.write_prepared(exec_fields), self.evidence.write_prepared(evidence_fields)

    def _durable_items(
        self, entries: tuple[LedgerEntry, LedgerEntry]
    ) -> tuple[tuple[Syncable, int], tuple[Syncable, int]]:
        exec_entry, evidence_entry = entries
        return (self.exec, exec_entry.seq), (self.evidence, evidence_entry.seq)

    def _write_pair(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> tuple[LedgerEntry, LedgerEntry]:
        entries = self._queue_pair(exec_record, evidence_record)
        self._syncer.make_durable(self._durable_items(entries))
        return entries

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
        return self._write_pair(
            *self._turn_records(
                turn_number=turn_number,
                query_hash=query_hash,
                result_hash=result_hash,
                status=status,
                declared_reads=declared_reads,
                declared_writes=declared_writes,
                external_calls=external_calls,
                capability_violations=capability_violations,
                work_order_id=work_order_id,
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
        exec_record, evidence_record = self._turn_records(
            turn_number=turn_number,
            query_hash=query_hash,
            result_hash=result_hash,
            status=status,
            declared_reads=declared_reads,
            declared_writes=declared_writes,
            external_calls=external_calls,
            capability_violations=capability_violations,
            work_order_id=None,
            exec_extra=exec_extra,
            evidence_extra=evidence_extra,
        )
        return PendingLines(
            (
                (self.exec, self.exec.prepare(exec_record)),
                (self.evidence, self.evidence.prepare(evidence_record)),
            )
        )

    def evidence_lines(self, record: Mapping[str, object]) -> PendingLines:
        """One evidence entry, checked and not sealed (as `turn_lines` does a pair): for a turn
        whose exec entry survived a crash without its evidence entry, rebuilt by the caller."""
        return PendingLines(((self.evidence, self.evidence.prepare(record)),))

    def _let_exec_out(self) -> int:
        """Release the exec ledger's held lines; the seq to make durable before an evidence
        entry that lets the evidence ledger's out (0: nothing to wait for)."""
        self.exec.release_all()
        seq = self.exec.ready_seq
        return seq if seq > self.exec.durable_seq else 0

    def release(self, lines: Iterable[SealedLine]) -> None:
        """The caller's store committed these sealed lines: they may go to the files now (with
        the next `flush` or `sync`). Lines of other ledgers are ignored."""
        exec_seqs: list[int] = []
        evidence_seqs: list[int] = []
        exec_id, evidence_id = self.exec.ledger_id, self.evidence.ledger_id
        for line in lines:
            if line.ledger_id == exec_id:
                exec_seqs.append(line.seq)
            elif line.ledger_id == evidence_id:
                evidence_seqs.append(line.seq)
        if exec_seqs:
            self.exec.release(exec_seqs)
        if evidence_seqs:
            self.evidence.release(evidence_seqs)

    def flush(self) -> None:
        """Write both files' queued lines now, without syncing (see `LedgerWriter.flush`)."""
        self.exec.flush()
        self.evidence.flush()

    def sync(self) -> tuple[int, int]:
        """Make everything written to both files durable (one sync round; blocking), up to
        the first line still held for its commit; returns the durable ``(exec seq, evidence
        seq)``."""
        exec_seq, evidence_seq = self.exec.ready_seq, self.evidence.ready_seq
        items: list[tuple[Syncable, int]] = []
        if exec_seq > self.exec.durable_seq:
            items.append((self.exec, exec_seq))
        if evidence_seq > self.evidence.durable_seq:
            items.append((self.evidence, evidence_seq))
        if items:
            self._syncer.make_durable(items)
        return exec_seq, evidence_seq

    def _turn_records(
        self,
        *,
        turn_number: int,
        query_hash: str,
        result_hash: str,
        status: str,
        declared_reads: Iterable[object],
        declared_writes: Iterable[object],
        external_calls: Iterable[object],
        capability_violations: Iterable[Mapping[str, object]],
        work_order_id: str | None,
        exec_extra: Mapping[str, object] | None,
        evidence_extra: Mapping[str, object] | None,
    ) -> tuple[dict[str, object], dict[str, object]]:
        exec_record = _merge(
            {
                "kind": KIND_TURN,
                "session_id": self.session_id,
                "turn_number": turn_number,
                "query_hash": query_hash,
                "result_hash": result_hash,
                "status": status,
            },
            exec_extra,
        )
        evidence_record: dict[str, object] = {
            "kind": KIND_TURN,
            "session_id": self.session_id,
            "turn_number": turn_number,
            "declared_reads": _items(declared_reads),
            "declared_writes": _items(declared_writes),
            "external_calls": _items(external_calls),
            "capability_violations": _items(capability_violations),
        }
        work_order = self.work_order_id if work_order_id is None else work_order_id
        if work_order is not None:
            evidence_record["work_order_id"] = work_order
        _merge(evidence_record, evidence_extra)
        return exec_record, evidence_record

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
        exec_seq = self._let_exec_out()
        if exec_seq:
            self._syncer.make_durable(((self.exec, exec_seq),))
        return self.evidence.append(
            self._violation_record(
                turn_number=turn_number,
                operation=operation,
                target=target,
                capability=capability,
                detail=detail,
                work_order_id=work_order_id,
                timestamp_us=timestamp_us,
            )
        )

    def _violation_record(
        self,
        *,
        turn_number: int,
        operation: str,
        target: str,
        capability: str,
        detail: str,
        work_order_id: str | None,
        timestamp_us: int | None,
    ) -> dict[str, object]:
        violation = {
            "operation": operation,
            "target": target,
            "capability": capability,
            "detail": detail,
            "timestamp_us": self._clock() if timestamp_us is None else timestamp_us,
        }
        record: dict[str, object] = {
            "kind": KIND_VIOLATION,
            "session_id": self.session_id,
            "turn_number": turn_number,
            "capability_violations": [violation],
        }
        work_order = self.work_order_id if work_order_id is None else work_order_id
        if work_order is not None:
            record["work_order_id"] = work_order
        return record

    def checkpoint(self) -> tuple[LedgerEntry, LedgerEntry]:
        """Append a checkpoint to each ledger (HO2)."""
        return self.exec.checkpoint(), self.evidence.checkpoint()

    def close(self) -> None:
        """Close both writers (everything written is made durable first)."""
        try:
            self.exec.close()
        finally:
            self.evidence.close()

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
        entries = self._queue_pair(
            *self._turn_records(
                turn_number=turn_number,
                query_hash=query_hash,
                result_hash=result_hash,
                status=status,
                declared_reads=declared_reads,
                declared_writes=declared_writes,
                external_calls=external_calls,
                capability_violations=capability_violations,
                work_order_id=work_order_id,
                exec_extra=exec_extra,
                evidence_extra=evidence_extra,
            )
        )
        await await_durable(self._syncer, self._durable_items(entries))
        return entries

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
        exec_seq = self._let_exec_out()
        if exec_seq:
            await await_durable(self._syncer, ((self.exec, exec_seq),))
        return await self.evidence.aappend(
            self._violation_record(
                turn_number=turn_number,
                operation=operation,
                target=target,
                capability=capability,
                detail=detail,
                work_order_id=work_order_id,
                timestamp_us=timestamp_us,
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
