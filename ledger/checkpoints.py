"""HO2 checkpoints (FR-RT-009): folded session state stored in the chain.

`fold` turns entries into a `SessionState` one at a time: entry and turn counts, the last turn
number, counts per exec status, and, for the evidence sets (declared reads, declared writes,
external calls, capability violations), a count and an order-dependent accumulator digest
``d' = sha256(DOMAIN_FOLD || d || canonical(item))``. Because the accumulator can be continued,
the state after a checkpoint plus the entries since equals the state of a full replay.

A checkpoint is an entry of kind ``checkpoint`` with ``covers_seq``/``covers_hash`` (the last
entry it folds) and ``state`` (`SessionState.to_dict`). `state_at` verifies the chain, takes the
latest checkpoint written at or before the target time, checks that its covered seq and hash are
the chain's entry there and that its state decodes and ends at that entry (``audit=True`` also
re-folds and compares), replays only the entries after it and returns the merged state. A bad
checkpoint falls back to a full replay: the state's ``fallback`` says why, and a warning is logged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import orjson
import structlog

from ledger.chain import DOMAIN_FOLD, genesis_hash, is_hex_hash
from ledger.entries import KIND_CHECKPOINT, KIND_TURN
from ledger.heads import HeadStore
from ledger.verify import Scan, verify_scan

__all__ = [
    "EMPTY_DIGEST",
    "SessionState",
    "checkpoint_record",
    "fold",
    "replay",
    "state_at",
    "state_from_scan",
]

_log = structlog.get_logger("ledger")

EMPTY_DIGEST: Final = hashlib.sha256(DOMAIN_FOLD + b"empty").hexdigest()
_SORT: Final = orjson.OPT_SORT_KEYS
_SETS: Final = (
    ("declared_reads", "reads"),
    ("declared_writes", "writes"),
    ("external_calls", "external_calls"),
    ("capability_violations", "violations"),
)


@dataclass(frozen=True, slots=True)
class SessionState:
    """Folded state of one ledger up to ``last_seq``.

    ``checkpoint_seq``, ``replayed`` and ``fallback`` describe how `state_at` obtained it and
    are not part of equality.
    """

    ledger_id: str
    session_id: str | None = None
    last_seq: int = 0
    last_hash: str = ""
    last_ts_us: int = 0
    entries: int = 0
    turns: int = 0
    last_turn_number: int = 0
    statuses: tuple[tuple[str, int], ...] = ()
    reads: int = 0
    reads_digest: str = EMPTY_DIGEST
    writes: int = 0
    writes_digest: str = EMPTY_DIGEST
    external_calls: int = 0
    external_calls_digest: str = EMPTY_DIGEST
    violations: int = 0
    violations_digest: str = EMPTY_DIGEST
    checkpoint_seq: int | None = field(default=None, compare=False)
    replayed: int = field(default=0, compare=False)
    fallback: str | None = field(default=None, compare=False)

    @classmethod
    def initial(cls, ledger_id: str, legacy_prefix: bytes = b"") -> SessionState:
        """The state before the first entry."""
        return cls(ledger_id=ledger_id, last_hash=genesis_hash(ledger_id, legacy_prefix))

    def status_counts(self) -> dict[str, int]:
        """Counts per exec status."""
        return dict(self.statuses)

    def to_dict(self) -> dict[str, object]:
        """The JSON form stored in a checkpoint entry."""
        return {
            "ledger_id": self.ledger_id,
            "session_id": self.session_id,
            "last_seq": self.last_seq,
            "last_hash": self.last_hash,
            "last_ts_us": self.last_ts_us,
            "entries": self.entries,
            "turns": self.turns,
            "last_turn_number": self.last_turn_number,
            "statuses": dict(self.statuses),
            "reads": self.reads,
            "reads_digest": self.reads_digest,
            "writes": self.writes,
            "writes_digest": self.writes_digest,
            "external_calls": self.external_calls,
            "external_calls_digest": self.external_calls_digest,
            "violations": self.violations,
            "violations_digest": self.violations_digest,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SessionState:
        """Decode a checkpoint's state; raise ``ValueError`` when malformed."""
        ints = (
            "last_seq",
            "last_ts_us",
            "entries",
            "turns",
            "last_turn_number",
            "reads",
            "writes",
            "external_calls",
            "violations",
        )
        digests = (
            "last_hash",
            "reads_digest",
            "writes_digest",
            "external_calls_digest",
            "violations_digest",
        )
        expected = set(ints) | set(digests) | {"ledger_id", "session_id", "statuses"}
        if set(data) != expected:
            msg = f"state keys differ: {sorted(set(data) ^ expected)}"
            raise ValueError(msg)
        for name in ints:
            if type(data[name]) is not int or data[name] < 0:  # type: ignore[operator]
                msg = f"state.{name} must be a non-negative int"
                raise ValueError(msg)
        for name in digests:
            if not is_hex_hash(data[name]):
                msg = f"state.{name} must be a hex digest"
                raise ValueError(msg)
        ledger_id = data["ledger_id"]
        session_id = data["session_id"]
        statuses = data["statuses"]
        if type(ledger_id) is not str or (session_id is not None and type(session_id) is not str):
            msg = "state.ledger_id/session_id must be strings"
            raise ValueError(msg)
        if not isinstance(statuses, dict) or not all(
            type(count) is int for count in statuses.values()
        ):
            msg = "state.statuses must map status to count"
            raise ValueError(msg)
        values = {name: data[name] for name in (*ints, *digests)}
        return cls(
            ledger_id=ledger_id,
            session_id=session_id,
            statuses=tuple(sorted(statuses.items())),
            **values,  # type: ignore[arg-type]
        )


def _accumulate(digest: str, item: object) -> str:
    return hashlib.sha256(
        DOMAIN_FOLD + digest.encode("ascii") + orjson.dumps(item, option=_SORT)
    ).hexdigest()


def fold(state: SessionState, entry: Mapping[str, object]) -> SessionState:
    """The state after one more (verified) entry."""
    seq = entry["seq"]
    digest = entry["entry_hash"]
    ts = entry.get("ts_us", state.last_ts_us)
    assert type(seq) is int
    assert type(digest) is str
    assert type(ts) is int
    kind = entry.get("kind")
    if kind == KIND_CHECKPOINT:
        return replace(state, last_seq=seq, last_hash=digest, last_ts_us=ts)
    changes: dict[str, object] = {
        "last_seq": seq,
        "last_hash": digest,
        "last_ts_us": ts,
        "entries": state.entries + 1,
    }
    session_id = entry.get("session_id")
    if state.session_id is None and type(session_id) is str:
        changes["session_id"] = session_id
    turn_number = entry.get("turn_number")
    if type(turn_number) is int and turn_number > state.last_turn_number:
        changes["last_turn_number"] = turn_number
    if kind == KIND_TURN:
        changes["turns"] = state.turns + 1
        status = entry.get("status")
        if type(status) is str:
            counts = dict(state.statuses)
            counts[status] = counts.get(status, 0) + 1
            changes["statuses"] = tuple(sorted(counts.items()))
    for key, name in _SETS:
        items = entry.get(key)
        if isinstance(items, list) and items:
            accumulated = getattr(state, f"{name}_digest")
            for item in items:
                accumulated = _accumulate(accumulated, item)
            changes[f"{name}_digest"] = accumulated
            changes[name] = getattr(state, name) + len(items)
    return replace(state, **changes)  # type: ignore[arg-type]


def replay(state: SessionState, entries: Sequence[Mapping[str, object]]) -> SessionState:
    """Fold every entry in order."""
    for entry in entries:
        state = fold(state, entry)
    return state


def checkpoint_record(state: SessionState) -> dict[str, object]:
    """The record of a checkpoint covering ``state`` (append it to the same ledger)."""
    return {
        "kind": KIND_CHECKPOINT,
        "covers_seq": state.last_seq,
        "covers_hash": state.last_hash,
        "state": state.to_dict(),
    }


def _check_checkpoint(
    checkpoint: Mapping[str, object],
    entries: Sequence[Mapping[str, object]],
    initial: SessionState,
    *,
    audit: bool,
) -> SessionState:
    covers_seq = checkpoint.get("covers_seq")
    covers_hash = checkpoint.get("covers_hash")
    seq = checkpoint["seq"]
    assert type(seq) is int
    if type(covers_seq) is not int or not 0 <= covers_seq < seq:
        msg = f"covers_seq {covers_seq!r} is not before the checkpoint"
        raise ValueError(msg)
    chain_hash = initial.last_hash if covers_seq == 0 else entries[covers_seq - 1]["entry_hash"]
    if covers_hash != chain_hash:
        msg = f"covers_hash does not match the chain's entry at seq {covers_seq}"
        raise ValueError(msg)
    raw_state = checkpoint.get("state")
    if not isinstance(raw_state, dict):
        msg = "state is not an object"
        raise ValueError(msg)  # noqa: TRY004 - ValueError is the "bad checkpoint" signal here
    state = SessionState.from_dict(raw_state)
    if state.last_seq != covers_seq or state.last_hash != covers_hash:
        msg = "state does not end at the covered entry"
        raise ValueError(msg)
    if state.ledger_id != initial.ledger_id:
        msg = "state belongs to another ledger"
        raise ValueError(msg)
    if audit and state != replay(initial, entries[:covers_seq]):
        msg = "state differs from a re-fold of the covered entries"
        raise ValueError(msg)
    return state


def state_from_scan(
    scan: Scan, path: Path, t_us: int | None = None, *, audit: bool = False
) -> SessionState:
    """State as of ``t_us`` (all entries when ``None``) from a collected, verified scan."""
    entries = scan.parsed
    ledger_id = scan.ledger_id or ""
    initial = SessionState.initial(ledger_id, scan.legacy_prefix)
    cut = len(entries)
    if t_us is not None:
        cut = 0
        for entry in entries:
            ts = entry["ts_us"]
            assert type(ts) is int
            if ts > t_us:
                break
            cut += 1
    for index in range(cut - 1, -1, -1):
        if entries[index].get("kind") == KIND_CHECKPOINT:
            checkpoint = entries[index]
            try:
                base = _check_checkpoint(checkpoint, entries, initial, audit=audit)
            except ValueError as exc:
                reason = f"checkpoint at seq {checkpoint['seq']} rejected: {exc}"
                _log.warning("ledger_checkpoint_rejected", path=str(path), reason=str(exc))
                full = replay(initial, entries[:cut])
                return replace(full, replayed=cut, fallback=reason)
            start = base.last_seq
            merged = replay(base, entries[start:cut])
            return replace(merged, checkpoint_seq=index + 1, replayed=cut - start)
    return replace(replay(initial, entries[:cut]), replayed=cut)


def state_at(
    path: Path | str,
    t_us: int | None = None,
    *,
    ledger_id: str | None = None,
    head_store: HeadStore | Path | None = None,
    audit: bool = False,
) -> SessionState:
    """Verify the ledger and return its folded state as of ``t_us`` (microseconds; ``None`` for
    the latest), starting from the latest checkpoint written at or before ``t_us``."""
    ledger_path = Path(path)
    _report, scan = verify_scan(
        ledger_path, ledger_id=ledger_id, head_store=head_store, collect=True
    )
    return state_from_scan(scan, ledger_path, t_us, audit=audit)
