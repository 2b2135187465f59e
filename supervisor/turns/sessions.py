"""The daemon's sessions: the sandbox sessions it has loaded, and the turn entries of their ledgers.

Process turns write their own exec and evidence entries inside the sandbox runtime (one sync for
both). Every other ending is the daemon's own: instruction turns, and the decisions the runtime
never saw (a cancel, an operator's terminate, an interrupted attempt that ends the turn after a
restart). `DaemonSessions.record_end` builds those lines, for either kind, from the store's
record, for the session's ledgers themselves (`ledger.SessionLedgers.turn_lines`: an
instruction turn never passes through the sandbox runtime); the store seals them once the
ending's fence held and commits them with it (the turn's one durable step, never a seq for a
refused ending), `sync_ledgers` syncs the files in rounds, and `restore` writes back
after a crash what the files lost.

The sandbox runtime is reached through the `RuntimeLike` / `SessionLike` protocols, so tests can
run the turn core with a runtime of their own.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import anyio
import anyio.to_thread
import msgspec

from ledger import SessionLedgers
from ledger.chain import content_hash
from ledger.entries import SealedLine
from sandbox.errors import CapabilityViolation
from sandbox.policy.attempts import AgentPhase, RetryOptions
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import ClaimLostError
from supervisor.logging import get_logger
from supervisor.store.protocol import SessionRecord, TurnRecord
from supervisor.store.sealing import LineSeal
from supervisor.turns.fairness import Share, share_of
from supervisor.wire.turn_spec import RequestedBy, spec_to_dict

__all__ = [
    "DaemonSessions",
    "ProcessResultLike",
    "RuntimeLike",
    "SessionLike",
    "verify_ledgers",
]


class ProcessAttemptLike(Protocol):
    """One attempt as the sandbox runtime reports it."""

    def to_dict(self) -> Mapping[str, object]: ...


class ProcessResultLike(Protocol):
    """What `SessionLike.run_process_turn` returns (`sandbox.runtime.TurnResult`)."""

    @property
    def status(self) -> str: ...
    @property
    def verdict(self) -> object: ...
    @property
    def reason_code(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def fault_type(self) -> object: ...
    @property
    def attempts(self) -> Sequence[ProcessAttemptLike]: ...
    @property
    def pending_lines(self) -> LineSeal | None:
        """The ending's two entries, unsealed, when the caller commits them (else None)."""
        ...

    def to_dict(self) -> Mapping[str, object]: ...


class EvidenceRefLike(Protocol):
    """Evidence bytes a session stored (`sandbox.runtime.evidence.EvidenceRef`)."""

    def to_dict(self) -> Mapping[str, object]: ...


class SessionLike(Protocol):
    """What the turn core needs from a sandbox session (`sandbox.runtime.Session`)."""

    @property
    def session_id(self) -> str: ...

    def check_turn_request(
        self,
        argv: Sequence[str],
        declared_outputs: object,
        *,
        turn_number: int | None = None,
        record: bool = True,
    ) -> None: ...

    def record_refused_request(
        self, violation: CapabilityViolation, *, turn_number: int | None = None
    ) -> None: ...

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
        ledger_commit: Literal["sync", "caller"] = "sync",
        first_attempt: int = 1,
        delay: Callable[[float], Awaitable[None]] = ...,
        before_promote: Callable[[], Awaitable[None]] | None = None,
        commit: Callable[[ProcessResultLike], Awaitable[None]] | None = None,
    ) -> ProcessResultLike: ...

    async def store_evidence(self, data: bytes) -> EvidenceRefLike:
        """Keep an executor's evidence bytes with the session, content-addressed, durably."""
        ...

    @property
    def ledgers(self) -> SessionLedgers:
        """The session's exec and evidence ledgers (the turn core seals its endings there)."""
        ...

    @property
    def ledger_ids(self) -> tuple[str, str]: ...

    @property
    def exec_ledger_path(self) -> Path: ...

    def evidence_lines(self, record: Mapping[str, object]) -> LineSeal:
        """One evidence entry for the store to seal and commit (a rebuilt one, after a
        crash)."""
        ...

    def release_ledgers(self, committed: Iterable[SealedLine]) -> None:
        """The store committed these sealed lines: they may go to the files (with the next
        flush or sync)."""
        ...

    def flush_ledgers(self, committed: Iterable[SealedLine] = ()) -> None:
        """Release *committed* (sealed lines the store has now), then write the queued lines
        to both files up to the first one still held, without syncing."""
        ...

    def sync_ledgers(self) -> tuple[int, int]:
        """Sync both files up to what was written (blocking); the durable seqs."""
        ...

    def restore_ledgers(self, lines: Sequence[SealedLine]) -> int:
        """Append lines the files lost in a crash (blocking); how many."""
        ...

    def close(self) -> None: ...


class RuntimeLike(Protocol):
    """What the turn core needs from the sandbox runtime (`sandbox.runtime.Runtime`)."""

    def open_session(
        self,
        package_id: str,
        *,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: Path | None = None,
    ) -> SessionLike: ...

    def resume_session(
        self,
        session_id: str,
        *,
        tier: str = "default",
        package_id: str | None = None,
        workspace: Path | None = None,
        work_order_id: str | None = None,
    ) -> SessionLike: ...


class DaemonSessions:
    """Sandbox sessions loaded in this daemon, by id, and their process-turn locks."""

    def __init__(self, runtime: RuntimeLike) -> None:
        self._runtime = runtime
        self._sessions: dict[str, SessionLike] = {}
        self._locks: dict[str, anyio.Lock] = {}
        #: ledger id -> the durable seq last trimmed in the store
        self._synced: dict[str, int] = {}
        #: session id -> its tenant and priority, for the fair order of parked turns
        self._shares: dict[str, Share] = {}
        #: sessions with committed lines to write, and the flusher's wake-up (None: no
        #: flusher runs, `flush` writes at once)
        self._dirty: dict[str, None] = {}
        self._wake: anyio.Event | None = None
        self._log = get_logger("supervisor.turns.sessions")

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> SessionLike | None:
        return self._sessions.get(session_id)

    def lock(self, session_id: str) -> anyio.Lock:
        """Process turns of one session run one at a time (they share its sandbox dirs)."""
        return self._locks.setdefault(session_id, anyio.Lock())

    async def open(
        self,
        *,
        package_id: str,
        tier: str,
        work_order_id: str | None,
        workspace: str | None,
    ) -> SessionLike:
        """Create a sandbox session (dirs, ledgers); not yet registered (see `add`)."""
        return await anyio.to_thread.run_sync(
            functools.partial(
                self._runtime.open_session,
                package_id,
                tier=tier,
                work_order_id=work_order_id,
                workspace=Path(workspace) if workspace else None,
            )
        )

    def add(self, session: SessionLike, record: SessionRecord | None = None) -> None:
        self._sessions[session.session_id] = session
        if record is not None:
            self._shares[session.session_id] = _share(record)

    def share(self, session_id: str) -> Share:
        """Whose turns the session's are when they wait for a slot (`fairness`)."""
        share = self._shares.get(session_id)
        return share if share is not None else share_of(session_id, tenant=None, priority=None)

    async def resume(self, record: SessionRecord) -> bool:
        """Load a session the store says is open (after a restart); False if it cannot be."""
        try:
            session = await anyio.to_thread.run_sync(
                functools.partial(
                    self._runtime.resume_session,
                    record.session_id,
                    tier=record.tier,
                    package_id=record.package_id,
                    workspace=Path(record.workspace) if record.workspace else None,
                    work_order_id=record.work_order_id,
                )
            )
        except Exception as exc:  # one broken session must not stop the daemon
            self._log.error("session_resume_failed", session_id=record.session_id, error=str(exc))
            return False
        self._sessions[record.session_id] = session
        self._shares[record.session_id] = _share(record)
        return True

    async def close(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        for ledger_id in session.ledger_ids if session is not None else ():
            self._synced.pop(ledger_id, None)
        self._locks.pop(session_id, None)
        self._shares.pop(session_id, None)
        if session is not None:
            await anyio.to_thread.run_sync(session.close)

    async def store_evidence(self, session_id: str, data: bytes) -> dict[str, object] | None:
        """Keep an executor's evidence bytes with its session; the reference recorded in the
        turn's result and evidence entry (None when the session is not loaded or the write
        failed: logged, and the turn keeps its evidence_hash)."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        try:
            return dict((await session.store_evidence(data)).to_dict())
        except OSError as exc:
            self._log.error("evidence_not_stored", session_id=session_id, error=str(exc))
            return None

    def close_all(self) -> None:
        for session in list(self._sessions.values()):
            session.close()
        self._sessions.clear()
        self._locks.clear()
        self._shares.clear()

    def record_end(self, turn: TurnRecord) -> LineSeal:
        """The turn's exec and evidence entries for an ending the daemon decided, checked and
        not sealed: the caller's store seals them once the ending's fence held and commits them
        with it (`TurnStore.finish`, `supervisor.store.sealing`), which makes them durable.
        `ClaimLostError` when the session is not loaded here (in a fleet: its home moved):
        a turn never ends without its two lines.

        The exec entry also carries the decision (``verdict``, ``reason_code``), so that a turn
        whose entries reached the file but whose ending did not reach the store (a crash in
        between) is ended from them after the restart, not run a second time.
        """
        session = self._sessions.get(turn.session_id)
        if session is None:  # dropped here (its home moved): no ending without its lines
            raise ClaimLostError(
                turn.turn_id,
                reason=f"its session {turn.session_id} is not loaded here (its home moved)",
            )
        calls = [
            {
                "executor_id": a.executor_id,
                "instruction_id": a.instruction_id,
                "attempt": a.attempt,
                "outcome": a.outcome,
                "fault_type": a.fault_type,
                "decision": a.decision,
                "reason_code": a.reason_code,
                "duration_ms": a.duration_ms,
            }
            for a in turn.attempts
        ]
        result = dict(turn.result) if turn.result is not None else {}
        result.update(
            state=turn.state.value,
            verdict=turn.verdict,
            reason_code=turn.reason_code,
            fault_type=turn.fault_type,
        )
        evidence = result.get("evidence")
        evidence_extra: dict[str, object] = {}
        if isinstance(evidence, Mapping):
            evidence_extra["evidence"] = dict(evidence)
        # a person's decision (a cancel, an operator's terminate): who took it and why
        decided_by = result.get("decided_by")
        decision: dict[str, object] = {}
        if isinstance(decided_by, Mapping):
            evidence_extra["decided_by"] = dict(decided_by)
            # in the exec entry too: a roll-forward that rebuilds the evidence entry keeps it
            decision["decided_by"] = dict(decided_by)
        # who asked, through a front end (`hunter mcp`): the MCP client and the server instance
        requested_by = turn.spec.requested_by
        if isinstance(requested_by, RequestedBy):
            evidence_extra["requested_by"] = msgspec.structs.asdict(requested_by)
        return session.ledgers.turn_lines(
            turn_number=turn.turn_number,
            query_hash=content_hash(spec_to_dict(turn.spec)),
            result_hash=content_hash(result),
            status=turn.state.value if turn.state is not TurnState.ACCEPTED else "accepted",
            external_calls=calls,
            exec_extra={
                "turn_id": turn.turn_id,
                "verdict": turn.verdict,
                "reason_code": turn.reason_code,
                "fault_type": turn.fault_type,
                **decision,
            },
            evidence_extra=evidence_extra or None,
        )

    def flush(self, session_id: str, committed: Iterable[SealedLine] = ()) -> None:
        """Put a session's committed lines into its files (no sync: the store holds them
        durably), so that readers of the files see every ended turn. *committed*: the sealed
        lines the store just committed, held out of the files until now (`turn_lines`).

        With the flusher running (`run_flusher`), the lines are released here and written once
        per event-loop pass for every session that got some: the turns that one group commit
        ended resume in the same pass, so their lines leave in one write per file instead of
        one each; the flusher runs before the tasks woken after this call (the clients' answers
        among them), so a client that reads the files after its answer finds the lines."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        wake = self._wake
        if wake is not None:
            session.release_ledgers(committed)
            self._dirty[session_id] = None
            wake.set()
            return
        self._write(session_id, session, committed)

    async def run_flusher(self) -> None:
        """Write the sessions' committed lines once per event-loop pass (see `flush`); until
        cancelled, when it writes what is left."""
        try:
            while True:
                wake = self._wake = anyio.Event()
                await wake.wait()
                self._flush_dirty()
        finally:
            self._wake = None
            self._flush_dirty()

    def write_pending(self) -> None:
        """Write the committed lines the flusher has not written yet, now (for a caller about
        to read the files)."""
        if self._dirty:
            self._flush_dirty()

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for session_id in dirty:
            session = self._sessions.get(session_id)
            if session is not None:
                self._write(session_id, session, ())

    def _write(
        self, session_id: str, session: SessionLike, committed: Iterable[SealedLine]
    ) -> None:
        try:
            session.flush_ledgers(committed)
        except Exception as exc:  # the store keeps the lines; the sync round reports it
            self._log.error("ledger_flush_failed", session_id=session_id, error=str(exc))

    async def sync_ledgers(self) -> dict[str, int]:
        """Sync every loaded session's ledger files up to what was written (a worker thread);
        returns ``{ledger_id: durable seq}`` for the ledgers that moved since the last round
        (the store trims its kept lines up to there; an idle ledger costs no store write)."""
        sessions = list(self._sessions.values())
        if not sessions:
            return {}
        reported = self._synced

        def sync_all() -> dict[str, int]:
            marks: dict[str, int] = {}
            for session in sessions:
                try:
                    exec_seq, evidence_seq = session.sync_ledgers()
                except Exception as exc:  # a closed or failed ledger: its lines stay kept
                    self._log.error(
                        "ledger_sync_failed", session_id=session.session_id, error=str(exc)
                    )
                    continue
                for ledger_id, seq in zip(
                    session.ledger_ids, (exec_seq, evidence_seq), strict=True
                ):
                    if reported.get(ledger_id) != seq:
                        marks[ledger_id] = seq
            return marks

        return await anyio.to_thread.run_sync(sync_all)

    def trimmed(self, marks: Mapping[str, int]) -> None:
        """The store dropped its kept lines up to *marks*: later rounds skip them unchanged."""
        self._synced.update(marks)

    async def restore(self, session: SessionLike, lines: Sequence[SealedLine]) -> int:
        """Write back the lines a crash kept from the session's files (a worker thread)."""
        return await anyio.to_thread.run_sync(session.restore_ledgers, lines)


def _share(record: SessionRecord) -> Share:
    return share_of(record.session_id, tenant=record.tenant, priority=record.priority)


async def verify_ledgers(
    root: Path,
    records: Sequence[SessionRecord],
    *,
    homes: Mapping[str, str] | None = None,
    owner: str | None = None,
) -> dict[str, object]:
    """Verify the exec and evidence ledgers of *records* under *root* (on a worker thread):
    ``{ok, ledgers, failures, elsewhere}``, a failure naming the session and the broken line.

    In a fleet, *homes* names the daemon homing each session that has a home now, and *owner*
    is this daemon. A session homed by another daemon has its files on that daemon's root and
    is checked there: it is listed in ``elsewhere``, not verified here and not a failure. So is
    a session no daemon homes now (closed, or waiting to be taken over) when this root holds
    none of its files; when it holds them, they are verified."""
    from ledger import IntegrityError, session_dir_for, verify_session_dir
    from ledger.verify import session_ledger_paths

    reports: list[dict[str, object]] = []
    failures: list[dict[str, object]] = []
    elsewhere: list[dict[str, object]] = []
    for record in records:
        session_dir = session_dir_for(root, record.tier, record.session_id)
        if homes is not None:
            home = homes.get(record.session_id)
            if home is not None and home != owner:
                elsewhere.append(
                    {
                        "session_id": record.session_id,
                        "home": home,
                        "detail": f"homed by {home}, checked there",
                    }
                )
                continue
            if home is None and not any(p.exists() for p in session_ledger_paths(session_dir)):
                elsewhere.append(
                    {
                        "session_id": record.session_id,
                        "home": None,
                        "detail": f"no daemon homes it now ({record.state.value}) and this"
                        " daemon's root holds none of its files: they are on the root of the"
                        " daemon that homed it last (`hunter ledger verify --store` checks the"
                        " store's copy)",
                    }
                )
                continue
        try:
            found = await anyio.to_thread.run_sync(verify_session_dir, session_dir)
        except IntegrityError as exc:
            failures.append({"session_id": record.session_id, "error": str(exc)})
            continue
        reports.extend(
            {
                "session_id": record.session_id,
                "ledger_id": r.ledger_id,
                "path": str(r.path),
                "entries": r.entries,
                "head_seq": r.head_seq,
                "head_hash": r.head_hash,
                "warnings": list(r.warnings),
            }
            for r in found
        )
    return {"ok": not failures, "ledgers": reports, "failures": failures, "elsewhere": elsewhere}
