# Hash-chained, crash-safe session ledgers (exec.jsonl, evidence.jsonl) and their verification.
# Layering: this package imports neither supervisor nor sandbox; both import it.
# Modules, lower layers first: errors, canonical (JSON rules), chain (hashes), entries (schema),
# files, clock, heads (anchors), verify, checkpoints, syncer (group commit); the writer's pieces
# lockfile, recovery (opening after a crash), linequeue (sealed lines not yet written),
# durability (synced seq, waiters, anchor), restore (lines a store puts back); writer; pending;
# the session's pieces sessiondir (paths), records (what a turn writes), pair (both writers as
# one); session; tail reads sealed lines; cli registers `hunter ledger verify|show`
# (see docs/ledger.md).
from ledger.checkpoints import SessionState, checkpoint_record, fold, replay, state_at
from ledger.entries import (
    KIND_CHECKPOINT,
    KIND_SESSION_OPENED,
    KIND_TURN,
    KIND_VIOLATION,
    LedgerEntry,
    SealedLine,
)
from ledger.errors import (
    IntegrityError,
    LedgerClosedError,
    LedgerError,
    LedgerLockedError,
    LedgerRecordError,
    LedgerSyncError,
)
from ledger.heads import Head, HeadStore, SidecarHeadStore, StateDirHeadStore, read_head
from ledger.session import SessionLedgers
from ledger.sessiondir import both_ledgers_exist, session_dir_for
from ledger.syncer import GroupSyncer, InlineSyncer, Syncer, SyncerStatistics
from ledger.verify import (
    BatchReport,
    VerifyReport,
    verify,
    verify_many,
    verify_root,
    verify_session_dir,
)
from ledger.writer import LedgerWriter, open_ledger

__all__ = [
    "KIND_CHECKPOINT",
    "KIND_SESSION_OPENED",
    "KIND_TURN",
    "KIND_VIOLATION",
    "BatchReport",
    "GroupSyncer",
    "Head",
    "HeadStore",
    "InlineSyncer",
    "IntegrityError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerError",
    "LedgerLockedError",
    "LedgerRecordError",
    "LedgerSyncError",
    "LedgerWriter",
    "SealedLine",
    "SessionLedgers",
    "SessionState",
    "SidecarHeadStore",
    "StateDirHeadStore",
    "Syncer",
    "SyncerStatistics",
    "VerifyReport",
    "both_ledgers_exist",
    "checkpoint_record",
    "fold",
    "open_ledger",
    "read_head",
    "replay",
    "session_dir_for",
    "state_at",
    "verify",
    "verify_many",
    "verify_root",
    "verify_session_dir",
]
