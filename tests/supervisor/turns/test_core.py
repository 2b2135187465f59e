"""The turn core: the attempt loop through the policy, ledgers, escalations, cancel, drain,
recovery.

The hub and the sandbox runtime are injected fakes (the core's plug points are Protocols); the
SQLite turn store and the ledgers are real. End-to-end runs with real executors live in
test_daemon_e2e.py.
"""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import orjson
import pytest

from ledger import GroupSyncer, SealedLine, SessionLedgers, verify_session_dir
from ledger.pending import PendingLines
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.lifecycle import TurnState
from sandbox.policy.retry_protocol import RetryOptions
from supervisor.errors import RequestError
from supervisor.store.protocol import TurnRecord, TurnStore
from supervisor.store.sqlite import open_sqlite_store
from supervisor.turns.context import CoreSettings
from supervisor.turns.core import TurnCore
from supervisor.wire.turn_spec import encode_spec
from tests.turn_requests import submitted

FAST = RetryOptions(max_attempts=3, base_delay_ms=1, backoff_multiplier=2, max_delay_ms=5)


@dataclass(frozen=True)
class FakeReport:
    outcome: AttemptOutcome
    executor_id: str | None = "fake-1"
    response: Any = None
    safety_reason_code: str = ""
    duration_ms: int = 1
    detail: str = ""
    evidence: bytes | None = None
    queued_ms: int = 0


@dataclass
class FakeHub:
    """Answers attempts from a script of outcomes (the last one repeats)."""

    script: list[AttemptOutcome] = field(default_factory=lambda: [AttemptOutcome.success()])
    envelopes: list[ExecutorInstructionEnvelope] = field(default_factory=list)
    queue_waits: list[float | None] = field(default_factory=list)
    full: bool = False
    gate: anyio.Event | None = None
    started: anyio.Event = field(default_factory=anyio.Event)
    _running: int = 0

    #: free executor slots the hub reports (the core parks turns when there are none)
    slots: int = 1000
    capacity: int | None = None
    queue_wait_s: float = 60.0

    def free_slots(self, command_type: ExecutorCommandType) -> int:
        return self.slots - self.running

    def serving(self, command_type: ExecutorCommandType) -> int:
        return 1  # one fake executor serves every command type

    @property
    def running(self) -> int:
        return self._running

    def admit(self, command_type: ExecutorCommandType, *, waiting: int = 0) -> None:
        if self.full or (self.capacity is not None and waiting >= self.capacity):
            from supervisor.executors.hub import QueueFullError

            raise QueueFullError(command_type, 1, 250)

    async def run_attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        *,
        queue_wait_s: float | None = None,
        queued_before_ms: int = 0,
        traceparent: str | None = None,
    ) -> FakeReport:
        self.envelopes.append(envelope)
        self.queue_waits.append(queue_wait_s)
        self.started.set()
        self._running += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self._running -= 1
        index = min(len(self.envelopes), len(self.script)) - 1
        # as the hub reports it: the wait before the call is part of the attempt's wait
        return FakeReport(
            self.script[index], queued_ms=queued_before_ms, duration_ms=1 + queued_before_ms
        )


@dataclass(frozen=True)
class FakeAttempt:
    data: dict[str, object]

    def to_dict(self) -> dict[str, object]:
        return self.data


@dataclass
class FakeTurnResult:
    status: str
    exit_code: int | None = 0
    attempts: tuple[FakeAttempt, ...] = ()
    verdict: str = "SUCCEED"
    reason_code: str = "SUCCESS"
    reason: str = "the process exited 0"
    fault_type: str | None = None
    pending_lines: PendingLines | None = None

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "exit_code": self.exit_code}


@dataclass(frozen=True)
class FakeEvidence:
    sha256: str
    size: int

    def to_dict(self) -> dict[str, object]:
        return {"sha256": self.sha256, "size": self.size}


class FakeSession:
    """A session with real ledgers; process turns answer from `process_status`."""

    def __init__(self, ledgers: SessionLedgers, process_status: str) -> None:
        self.ledgers = ledgers
        self.session_id = ledgers.session_id
        self.process_status = process_status
        self.process_calls: list[dict[str, Any]] = []
        self.blocked = anyio.Event()

    def check_turn_request(
        self,
        argv: Sequence[str],
        declared_outputs: object,
        *,
        turn_number: int | None = None,
        record: bool = True,
    ) -> None:
        if argv[0] == "forbidden":
            raise PermissionError("forbidden executable")

    def record_refused_request(
        self, violation: Exception, *, turn_number: int | None = None
    ) -> None:
        raise AssertionError("the fake's checks refuse nothing as a violation")

    async def run_process_turn(self, argv: Sequence[str], **kwargs: Any) -> FakeTurnResult:
        self.process_calls.append({"argv": list(argv), **kwargs})
        if argv[0] == "explode":
            raise RuntimeError("the sandbox broke")
        if argv[0] == "block":
            self.blocked.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                # as the real runtime does: a turn cut short gets its entries here unless the
                # caller commits them (then the daemon records how it ended)
                if kwargs.get("ledger_commit") == "caller":
                    raise
                with anyio.CancelScope(shield=True):
                    await self.ledgers.arecord_turn(
                        turn_number=kwargs["turn_number"],
                        query_hash=_h(argv),
                        result_hash=_h("cancelled"),
                        status="terminated",
                    )
                raise
        entry = {
            "turn_number": kwargs["turn_number"],
            "query_hash": _h(argv),
            "result_hash": _h(self.process_status),
            "status": self.process_status,
        }
        pending: PendingLines | None = None
        if kwargs.get("ledger_commit") == "caller":  # the daemon's store seals and commits them
            pending = self.ledgers.turn_lines(**entry)
        else:
            await self.ledgers.arecord_turn(**entry)
        return FakeTurnResult(
            status=self.process_status,
            attempts=(FakeAttempt({"outcome": "SUCCESS", "exit_code": 0, "verdict": "SUCCEED"}),),
            pending_lines=pending,
        )

    async def store_evidence(self, data: bytes) -> FakeEvidence:
        return FakeEvidence(hashlib.sha256(data).hexdigest(), len(data))

    @property
    def ledger_ids(self) -> tuple[str, str]:
        return self.ledgers.exec.ledger_id, self.ledgers.evidence.ledger_id

    @property
    def exec_ledger_path(self) -> Path:
        return self.ledgers.exec_path

    def evidence_lines(self, record: Mapping[str, object]) -> PendingLines:
        return self.ledgers.evidence_lines(record)

    def release_ledgers(self, committed: Iterable[SealedLine]) -> None:
        self.ledgers.release(committed)

    def flush_ledgers(self, committed: Iterable[SealedLine] = ()) -> None:
        self.ledgers.release(committed)
        self.ledgers.flush()

    def sync_ledgers(self) -> tuple[int, int]:
        return self.ledgers.sync()

    def restore_ledgers(self, lines: Sequence[SealedLine]) -> int:
        exec_id, evidence_id = self.ledger_ids
        n = self.ledgers.exec.restore(x for x in lines if x.ledger_id == exec_id)
        return n + self.ledgers.evidence.restore(x for x in lines if x.ledger_id == evidence_id)

    def close(self) -> None:
        self.ledgers.close()


def _h(obj: object) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


class FakeRuntime:
    def __init__(self, root: Path, syncer: GroupSyncer, process_status: str = "succeeded"):
        self.root = root
        self.syncer = syncer
        self.process_status = process_status
        self.sessions: dict[str, FakeSession] = {}
        self._ids = itertools.count(1)

    def open_session(
        self,
        package_id: str,
        *,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: Path | None = None,
    ) -> FakeSession:
        if package_id == "missing":
            raise FileNotFoundError("package 'missing' is not installed")
        sid = f"SES-test-{next(self._ids)}"
        ledgers = SessionLedgers.create(
            root=self.root, tier=tier, session_id=sid, syncer=self.syncer
        )
        self.sessions[sid] = FakeSession(ledgers, self.process_status)
        return self.sessions[sid]

    def resume_session(
        self,
        session_id: str,
        *,
        tier: str = "default",
        package_id: str | None = None,
        workspace: Path | None = None,
        work_order_id: str | None = None,
    ) -> FakeSession:
        ledgers = SessionLedgers.open(
            root=self.root, tier=tier, session_id=session_id, syncer=self.syncer
        )
        self.sessions[session_id] = FakeSession(ledgers, self.process_status)
        return self.sessions[session_id]


@dataclass
class Rig:
    turn_core: TurnCore
    hub: FakeHub
    runtime: FakeRuntime
    store: TurnStore
    root: Path


def _db(root: Path) -> Path:
    return root / "state" / "turns.sqlite3"


def _sql(root: Path, statement: str, *args: object) -> None:
    """Change the store behind the daemon's back (the daemon is stopped): for restart tests."""
    with sqlite3.connect(_db(root)) as conn:
        conn.execute(statement, args)


@asynccontextmanager
async def rig(
    tmp_path: Path,
    hub: FakeHub | None = None,
    *,
    process_status: str = "succeeded",
    ledger_sync_interval_s: float = 0.25,
) -> AsyncIterator[Rig]:
    hub = hub or FakeHub()
    async with open_sqlite_store(_db(tmp_path)) as store:
        with GroupSyncer() as syncer:
            runtime = FakeRuntime(tmp_path, syncer, process_status)
            core = TurnCore(
                store=store,
                hub=hub,
                runtime=runtime,
                settings=CoreSettings(
                    root=tmp_path,
                    retry=FAST,
                    process_slots=2,
                    ledger_sync_interval_s=ledger_sync_interval_s,
                ),
            )
            async with anyio.create_task_group() as tg:
                await tg.start(core.run)
                yield Rig(core, hub, runtime, store, tmp_path)
                tg.cancel_scope.cancel()


def _instruction(sid: str, **extra: object) -> dict[str, object]:
    return {
        "session_id": sid,
        "kind": "instruction",
        "command_type": "READ",
        "target_selector": "#main",
        "timeout_ms": 1000,
        "declared_outputs": [],
        **extra,
    }


async def _open(r: Rig) -> str:
    return (await r.turn_core.open_session(package_id="demo")).session_id


async def _run(r: Rig, params: dict[str, object]) -> Any:
    turn, _ = await r.turn_core.submit(submitted(params))
    return await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)


def _verify(root: Path, sid: str) -> list[Any]:
    return verify_session_dir(root / "planes" / "default" / "sessions" / sid)


async def test_instruction_success(tmp_path: Path) -> None:
    """A SUCCESS outcome ends the turn `succeeded` with both ledger entries written."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        assert [a.decision for a in turn.attempts] == ["SUCCEED"]
        assert r.hub.envelopes[0].instruction_id == f"INS-{turn.turn_id}-1"
        reports = _verify(tmp_path, sid)
        assert [rep.entries for rep in reports] == [2, 2]


async def test_retry_then_success(tmp_path: Path) -> None:
    """A CRASH is retried after the backoff; the next attempt succeeds."""
    hub = FakeHub(script=[AttemptOutcome.fault(ExecutionFaultType.CRASH), AttemptOutcome.success()])
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        assert [a.decision for a in turn.attempts] == ["RETRY", "SUCCEED"]
        assert [a.fault_type for a in turn.attempts] == ["CRASH", None]
        assert [e.instruction_id for e in hub.envelopes] == [
            f"INS-{turn.turn_id}-1",
            f"INS-{turn.turn_id}-2",
        ]


async def test_timeout_terminates_after_three(tmp_path: Path) -> None:
    """TIMEOUT retries twice and terminates on the third attempt (state `timeout`)."""
    hub = FakeHub(script=[AttemptOutcome.fault(ExecutionFaultType.TIMEOUT)])
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.TIMEOUT
        assert [a.decision for a in turn.attempts] == ["RETRY", "RETRY", "TERMINATE"]
        assert turn.reason_code == "TIMEOUT_RETRY_LIMIT_REACHED"


@pytest.mark.parametrize(
    ("outcome", "state", "reason"),
    [
        (
            AttemptOutcome.fault(ExecutionFaultType.PARTIAL),
            TurnState.TERMINATED,
            "PARTIAL_NOT_RETRYABLE",
        ),
        (
            AttemptOutcome.fault(ExecutionFaultType.INVALID_RESPONSE),
            TurnState.TERMINATED,
            "INVALID_RESPONSE_NOT_RETRYABLE",
        ),
        (
            AttemptOutcome.fault(ExecutionFaultType.SECURITY_VIOLATION),
            TurnState.VIOLATION,
            "SECURITY_VIOLATION_TERMINATE",
        ),
        (AttemptOutcome.refused("no"), TurnState.TERMINATED, "EXECUTOR_REFUSED"),
        (AttemptOutcome.failure(None, "did not work"), TurnState.FAILED, "FAILURE_NOT_RETRIED"),
    ],
)
async def test_terminal_outcomes(
    tmp_path: Path, outcome: AttemptOutcome, state: TurnState, reason: str
) -> None:
    """Non-retryable outcomes end the turn after one attempt with the policy's reason."""
    async with rig(tmp_path, FakeHub(script=[outcome])) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert (turn.state, turn.reason_code, len(turn.attempts)) == (state, reason, 1)


async def test_escalation_resolved_by_retry_and_terminate(tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED parks the turn; an operator's retry runs it again, terminate ends it."""
    hub = FakeHub(
        script=[
            AttemptOutcome.fault(ExecutionFaultType.RESOURCE_EXHAUSTED),
            AttemptOutcome.success(),
            AttemptOutcome.fault(ExecutionFaultType.RESOURCE_EXHAUSTED),
        ]
    )
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.ESCALATED
        assert [t.turn_id for t in (await r.turn_core.list_escalations()).turns] == [turn.turn_id]
        await r.turn_core.resolve_escalation(turn.turn_id, "retry")
        done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        other = await _run(r, _instruction(sid))
        assert other.state is TurnState.ESCALATED
        ended = await r.turn_core.resolve_escalation(other.turn_id, "terminate")
        assert (ended.state, ended.reason_code) == (TurnState.TERMINATED, "OPERATOR_TERMINATED")
        with pytest.raises(RequestError, match=r"^turn \d+ is terminated, not escalated$"):
            await r.turn_core.resolve_escalation(other.turn_id, "retry")
        assert all(rep.entries >= 2 for rep in _verify(tmp_path, sid))


async def test_idempotent_resubmission(tmp_path: Path) -> None:
    """The same idempotency key returns the same turn and runs it once."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        request = submitted(_instruction(sid, idempotency_key="abc"))
        first, created = await r.turn_core.submit(request)
        again, created_again = await r.turn_core.submit(request)
        assert created
        assert not created_again
        assert again.turn_id == first.turn_id
        await r.turn_core.wait_turn(first.turn_id, timeout_s=10)
        assert len(r.hub.envelopes) == 1


async def test_queue_full_is_refused_before_accepting(tmp_path: Path) -> None:
    """When the hub's queue is full, submit fails with queue_full and nothing is accepted."""
    async with rig(tmp_path, FakeHub(full=True)) as r:
        sid = await _open(r)
        with pytest.raises(
            RequestError, match=r"^the READ queue is full; retry in 250 ms$"
        ) as info:
            await r.turn_core.submit(submitted(_instruction(sid)))
        assert info.value.code == "queue_full"
        assert info.value.details["retry_after_ms"] == 250
        assert (await r.store.list_turns()).turns == ()


async def test_cancel_running_turn(tmp_path: Path) -> None:
    """Cancelling a turn whose attempt is in flight ends it `cancelled`, ledgers written."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await hub.started.wait()
        cancelled = await r.turn_core.cancel_turn(turn.turn_id)
        assert cancelled.state is TurnState.CANCELLED
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]


async def test_process_turn_runs_in_session(tmp_path: Path) -> None:
    """Process turns go to Session.run_process_turn with the turn number and declarations."""
    async with rig(tmp_path, process_status="failed") as r:
        sid = await _open(r)
        turn = await _run(
            r,
            {
                "session_id": sid,
                "kind": "process",
                "argv": ["python3", "-c", "pass"],
                "declared_outputs": ["out.txt"],
                "phase": "GREEN",
                "timeout_ms": 500,
            },
        )
        assert turn.state is TurnState.FAILED
        (call,) = r.runtime.sessions[sid].process_calls
        assert call["turn_number"] == turn.turn_number
        assert call["declared_outputs"] == [{"path": "out.txt", "role": "output"}]
        assert call["timeout_ms"] == 500


async def test_process_turn_rejected_at_intake(tmp_path: Path) -> None:
    """A request the session refuses (capabilities) is not accepted."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        request = submitted(
            {"session_id": sid, "kind": "process", "argv": ["forbidden"], "declared_outputs": []}
        )
        with pytest.raises(RequestError, match=r"^forbidden executable$"):
            await r.turn_core.submit(request)
        assert (await r.store.list_turns()).turns == ()


async def test_drain_leaves_unstarted_work_for_restart(tmp_path: Path) -> None:
    """Draining refuses new turns; an in-flight attempt cancelled at the deadline stays running."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        # running: the start is durable (a start is written once the attempt outlives 2 ms)
        await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
        assert await r.turn_core.drain(0.01) is False
        with pytest.raises(RequestError, match=r"^the daemon is draining"):
            await r.turn_core.submit(submitted(_instruction(sid)))
    async with open_sqlite_store(_db(tmp_path)) as store:
        assert (await store.get_turn(turn.turn_id)).state is TurnState.RUNNING


async def test_restart_turns_interrupted_attempt_into_crash(tmp_path: Path) -> None:
    """After a restart an interrupted attempt is a CRASH and the policy retries it."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        # running: the start is durable (a start is written once the attempt outlives 2 ms)
        await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
    async with rig(tmp_path) as r2:
        done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert [(a.fault_type, a.decision) for a in done.attempts] == [
            ("CRASH", "RETRY"),
            (None, "SUCCEED"),
        ]
        assert all(rep.entries == 2 for rep in _verify(tmp_path, sid))


async def test_error_in_a_turn_ends_that_turn_only(tmp_path: Path) -> None:
    """An unexpected error while running a turn terminates it; the turn core keeps working."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        broken = await _run(
            r, {"session_id": sid, "kind": "process", "argv": ["explode"], "declared_outputs": []}
        )
        assert (broken.state, broken.reason_code) == (TurnState.TERMINATED, "INTERNAL_ERROR")
        assert broken.reason == "RuntimeError: the sandbox broke"
        fine = await _run(r, _instruction(sid))
        assert fine.state is TurnState.SUCCEEDED


async def test_drain_waits_until_the_outcome_is_recorded(tmp_path: Path) -> None:
    """An attempt that answers within the grace period is recorded before drain returns."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await hub.started.wait()
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                assert await r.turn_core.drain(30) is True

            tg.start_soon(drain)
            await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
            assert hub.gate is not None
            hub.gate.set()
        assert (await r.store.get_turn(turn.turn_id)).state is TurnState.SUCCEEDED


async def _blocked_process_turn(r: Rig) -> tuple[str, TurnRecord]:
    """A new session and a process turn of it whose command is running (and blocks)."""
    sid = await _open(r)
    params = {"session_id": sid, "kind": "process", "argv": ["block"], "declared_outputs": []}
    turn, _ = await r.turn_core.submit(submitted(params))
    await r.runtime.sessions[sid].blocked.wait()
    return sid, turn


def _runs_true_from_now_on(tmp_path: Path, turn: TurnRecord) -> None:
    """Rewrite the stored turn's argv to ``true`` (its next run after a restart succeeds)."""
    _sql(
        tmp_path,
        "UPDATE turns SET spec = ? WHERE turn_id = ?",
        encode_spec(msgspec.structs.replace(turn.spec, argv=("true",))),
        turn.turn_id,
    )


async def test_restart_reruns_interrupted_process_turn(tmp_path: Path) -> None:
    """A process turn interrupted by a restart once its start was written (it outlived the
    start's short deferral) is a CRASH; its retry gets the rest of the attempt budget."""
    async with rig(tmp_path) as r:
        sid, turn = await _blocked_process_turn(r)
        # the start is durable (written once the attempt outlived its deferral)
        await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
    _runs_true_from_now_on(tmp_path, turn)
    async with rig(tmp_path) as r2:
        done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert next((a.fault_type, a.decision) for a in done.attempts) == ("CRASH", "RETRY")
        (call,) = r2.runtime.sessions[sid].process_calls
        # the rest of the budget: the runtime numbers its attempts on from the turn's (2 of 3)
        assert call["options"].max_attempts == 3
        assert call["first_attempt"] == 2


async def test_restart_within_the_start_deferral_runs_the_attempt_again(tmp_path: Path) -> None:
    """A process turn stopped by a restart before its start was written (within the start's
    deferral) is found accepted and runs that attempt again under the same number, not
    counted as a CRASH (`supervisor/turns/starts.py`)."""
    async with rig(tmp_path) as r:
        r.turn_core._deps.starts.delay_s = 60.0  # the start is never due while it runs
        sid, turn = await _blocked_process_turn(r)
        assert (await r.store.get_turn(turn.turn_id)).state is TurnState.ACCEPTED
    _runs_true_from_now_on(tmp_path, turn)
    async with rig(tmp_path) as r2:
        done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert [a.attempt for a in done.attempts] == [1]
        (call,) = r2.runtime.sessions[sid].process_calls
        assert call["first_attempt"] == 1


async def test_cancel_running_process_turn_writes_ledgers(tmp_path: Path) -> None:
    """A process turn cancelled mid-run ends `cancelled` and still gets both ledger entries."""
    async with rig(tmp_path) as r:
        sid, turn = await _blocked_process_turn(r)
        cancelled = await r.turn_core.cancel_turn(turn.turn_id)
        assert cancelled.state is TurnState.CANCELLED
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]


async def test_close_refused_while_a_turn_is_being_submitted(tmp_path: Path) -> None:
    """A session cannot be closed under a submission not yet accepted: here its accept waits
    for the database's write lock, which another connection holds."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        params = {"session_id": sid, "kind": "process", "argv": ["/bin/true"]}
        results: list[Any] = []

        async def submit() -> None:
            request = submitted({**params, "declared_outputs": []})
            results.append(await r.turn_core.submit(request))

        other = sqlite3.connect(_db(tmp_path), isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                await anyio.wait_all_tasks_blocked()  # the accept waits for the write lock
                try:
                    with pytest.raises(
                        RequestError, match=r"^session .* a turn being submitted"
                    ) as e:
                        await r.turn_core.close_session(sid)
                    assert e.value.code == "session_busy"
                finally:
                    other.execute("ROLLBACK")
        finally:
            other.close()
        ((turn, created),) = results
        assert created
        done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]
        await r.turn_core.close_session(sid)


async def test_restart_ending_an_interrupted_process_turn_writes_ledgers(tmp_path: Path) -> None:
    """A process turn whose interrupted last attempt ends it after a restart gets both ledger
    entries (the runtime never saw that ending, so the turn core writes them)."""
    async with rig(tmp_path) as r:
        sid, turn = await _blocked_process_turn(r)
        await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
    # as if the daemon had stopped during the last attempt of the budget
    _sql(
        tmp_path, "UPDATE turns SET attempt = ? WHERE turn_id = ?", FAST.max_attempts, turn.turn_id
    )
    async with rig(tmp_path) as r2:
        done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.final
        assert done.attempts[-1].fault_type == "CRASH"
        assert r2.runtime.sessions[sid].process_calls == []
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]


async def test_concurrent_resolutions_of_one_escalation(tmp_path: Path) -> None:
    """Two operators resolving one parked turn at once: the first decision wins, the second
    is refused, and the intake never moves a terminated turn back to accepted."""
    hub = FakeHub(script=[AttemptOutcome.fault(ExecutionFaultType.RESOURCE_EXHAUSTED)])
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.ESCALATED
        answers: dict[str, object] = {}

        async def resolve(action: str) -> None:
            try:
                answers[action] = (await r.turn_core.resolve_escalation(turn.turn_id, action)).state
            except RequestError as exc:
                answers[action] = exc.code

        async with anyio.create_task_group() as tg:
            tg.start_soon(resolve, "terminate")
            tg.start_soon(resolve, "retry")
        assert answers == {"terminate": TurnState.TERMINATED, "retry": "not_escalated"}
        assert (await r.store.get_turn(turn.turn_id)).state is TurnState.TERMINATED
        assert all(rep.entries == 3 for rep in _verify(tmp_path, sid))


async def test_a_failing_hub_ends_the_turn_with_its_cause(tmp_path: Path) -> None:
    """When the hub itself fails, the turn ends terminated with the hub's error as its reason,
    and the core keeps serving."""

    class BrokenHub(FakeHub):
        async def run_attempt(
            self,
            envelope: ExecutorInstructionEnvelope,
            *,
            queue_wait_s: float | None = None,
            queued_before_ms: int = 0,
            traceparent: str | None = None,
        ) -> FakeReport:
            raise RuntimeError("the hub broke")

    async with rig(tmp_path, BrokenHub()) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert (turn.state, turn.reason_code) == (TurnState.TERMINATED, "INTERNAL_ERROR")
        assert turn.reason == "RuntimeError: the hub broke"
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]
