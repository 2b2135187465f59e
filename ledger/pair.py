"""A session's two ledger writers, exec and evidence, written and made durable as one.

A turn writes one entry to each ledger, and the pair is made durable in one sync round of the
syncer they share: both records are validated before either is written, so a bad record never
leaves a turn in one ledger only. Lines held for a caller's commit (`LedgerWriter.seal_prepared`)
go out together too: `release` lets each ledger's out, `sync` makes both durable up to the first
line still held, and an evidence entry written at once (a violation) first lets the exec
ledger's held lines out and waits for them (`let_exec_out`), so a crash may leave a turn's exec
entry without its evidence entry (recovery rebuilds it), never the reverse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from ledger.clock import Clock
from ledger.entries import LedgerEntry, SealedLine
from ledger.errors import IntegrityError
from ledger.files import make_dirs
from ledger.pending import PendingLines
from ledger.syncer import InlineSyncer, Syncable, Syncer, await_durable
from ledger.verify import session_ledger_paths
from ledger.writer import LedgerWriter

__all__ = ["LedgerPair"]


class LedgerPair:
    """The exec and evidence writers of one session and the syncer they share."""

    __slots__ = ("evidence", "exec", "syncer")

    def __init__(
        self, exec_writer: LedgerWriter, evidence_writer: LedgerWriter, syncer: Syncer
    ) -> None:
        self.exec = exec_writer
        self.evidence = evidence_writer
        self.syncer = syncer

    @classmethod
    def open(
        cls,
        session_dir: Path,
        *,
        session_id: str,
        syncer: Syncer | None,
        clock: Clock,
        files: Literal["new", "existing", "any"],
    ) -> LedgerPair:
        """Open both ledgers of the session in *session_dir*, sharing *syncer* (inline syncing
        when None); neither stays open if the other fails to open.

        *files* says what may be there: ``"new"`` creates both (raises ``FileExistsError`` if
        either exists), ``"existing"`` reopens both (raises `IntegrityError` if either is
        missing), ``"any"`` creates what is missing.
        """
        exec_path, evidence_path = session_ledger_paths(session_dir)
        if files == "existing":
            for path in (exec_path, evidence_path):
                if not path.is_file():
                    raise IntegrityError(
                        path, 0, None, "ledger missing: a session needs both ledgers"
                    )
        else:
            if files == "new":
                for path in (exec_path, evidence_path):
                    if path.exists():
                        raise FileExistsError(f"{path}: session ledger already exists")
            make_dirs(exec_path.parent)
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
        return cls(exec_writer, evidence_writer, shared)

    def queue(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """Seal and queue both records (both checked first), without waiting for durability."""
        # Validate both before writing either, so a bad record never leaves a turn in one
        # ledger only.
        exec_fields = self.exec.prepare(exec_record)
        evidence_fields = self.evidence.prepare(evidence_record)
        return self.exec.write_prepared(exec_fields), self.evidence.write_prepared(evidence_fields)

    def _durable_items(
        self, entries: tuple[LedgerEntry, LedgerEntry]
    ) -> tuple[tuple[Syncable, int], tuple[Syncable, int]]:
        """What to hand the syncer to make both *entries* durable."""
        exec_entry, evidence_entry = entries
        return (self.exec, exec_entry.seq), (self.evidence, evidence_entry.seq)

    def write(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """`queue` both records; return once both are durable (one sync round)."""
        entries = self.queue(exec_record, evidence_record)
        self.syncer.make_durable(self._durable_items(entries))
        return entries

    async def awrite(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """`write` for async callers: both lines are queued in the calling thread; the task then
        awaits durability (`await_durable`)."""
        entries = self.queue(exec_record, evidence_record)
        await await_durable(self.syncer, self._durable_items(entries))
        return entries

    def restore(self, lines: Iterable[SealedLine]) -> int:
        """Put back the lines a store kept that the files lack, each into its own ledger
        (`LedgerWriter.restore`; lines of other ledgers are ignored); returns how many."""
        kept = list(lines)
        exec_id, evidence_id = self.exec.ledger_id, self.evidence.ledger_id
        appended = self.exec.restore(x for x in kept if x.ledger_id == exec_id)
        return appended + self.evidence.restore(x for x in kept if x.ledger_id == evidence_id)

    def pending(
        self, exec_record: Mapping[str, object], evidence_record: Mapping[str, object]
    ) -> PendingLines:
        """Both records checked (both before either is sealed) but not sealed: the caller's
        store seals them in its commit (`PendingLines`)."""
        return PendingLines(
            (
                (self.exec, self.exec.prepare(exec_record)),
                (self.evidence, self.evidence.prepare(evidence_record)),
            )
        )

    def let_exec_out(self) -> None:
        """Before an evidence entry that must be durable now (and so lets the evidence ledger's
        held lines out): release the exec ledger's held lines and wait until they are durable,
        so that the exec ledger is never behind the evidence ledger."""
        seq = self._exec_out()
        if seq:
            self.syncer.make_durable(((self.exec, seq),))

    async def alet_exec_out(self) -> None:
        """`let_exec_out` for async callers (`await_durable`)."""
        seq = self._exec_out()
        if seq:
            await await_durable(self.syncer, ((self.exec, seq),))

    def _exec_out(self) -> int:
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
            self.syncer.make_durable(items)
        return exec_seq, evidence_seq

    def checkpoint(self) -> tuple[LedgerEntry, LedgerEntry]:
        """Append a checkpoint to each ledger (HO2)."""
        return self.exec.checkpoint(), self.evidence.checkpoint()

    def close(self) -> None:
        """Close both writers (everything written is made durable first)."""
        try:
            self.exec.close()
        finally:
            self.evidence.close()
