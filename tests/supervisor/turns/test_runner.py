"""Running turns (`supervisor.turns.runner.TurnRunner`): when a turn starts, in a task or on the
record path, and how the daemon itself ends one that fails or is cancelled.

Everything is real: the SQLite turn store in the test's own directory, the sandbox runtime of
``conftest.sandbox_runtime`` (package ``pkg``), the executor hub on a Unix socket and SDK
executors connected to it. A "restart" closes the core, the store and the hub and opens new ones
on the same files. A broken store is the real engine refusing a write (a trigger added behind
the daemon's back), a lost claim the turn's token moved on in the store (another daemon took
the turn over).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import orjson
import pytest
import structlog.testing

from ledger import session_dir_for
from sandbox.errors import (
    CapabilityViolation,
    DeclarationError,
    ManifestError,
    PackageNotFoundError,
    SandboxUnavailableError,
)
from sandbox.policy.breaker import BreakerLimits
from sandbox.policy.budget import BudgetLimits
from sandbox.policy.lifecycle import TurnState
from sandbox.policy.retry_protocol import RetryOptions
from sandbox.runtime import Runtime
from supervisor.errors import RequestError
from supervisor.executors.hub import ExecutorHub, open_executor_listener
from supervisor.executors.settings import HubSettings
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.store.protocol import TurnRecord, TurnStore
from supervisor.store.sqlite import open_sqlite_store
from supervisor.turns.context import CoreSettings
from supervisor.turns.core import TurnCore
from supervisor.turns.runner import error_code
from tests.turn_requests import submitted

#: The bound of every wait here; a healthy run takes well under a second each.
WAIT_S = 20.0
#: Quick retries (1 ms backoff), three attempts.
FAST = RetryOptions(max_attempts=3, base_delay_ms=1, backoff_multiplier=2, max_delay_ms=5)
#: Claims renewed every 200 s: no renewal meets a test's own move of a claim.
LEASE_MS = 600_000


# -- executors ---------------------------------------------------------------------------------


class Reader(Executor):
    """READ answers SUCCESS with evidence ``page`` (the bytes attached with *attach*); every
    instruction id received is kept in `seen`."""

    def __init__(self, *, attach: bool = False, output: Mapping[str, object] | None = None):
        super().__init__(executor_id="reader")
        self.attach = attach
        self.output = output
        self.seen: list[str] = []

    async def read(self, instruction: Instruction) -> Result:
        self.seen.append(instruction.instruction_id)
        return Result.success("page", attach_evidence=self.attach, output=self.output)


class Gated(Executor):
    """READ waits for `gate` (`started` set meanwhile), then answers SUCCESS."""

    def __init__(self) -> None:
        super().__init__(executor_id="gated")
        self.started = anyio.Event()
        self.gate = anyio.Event()
        self.seen: list[str] = []

    async def read(self, instruction: Instruction) -> Result:
        self.seen.append(instruction.instruction_id)
        self.started.set()
        await self.gate.wait()
        return Result.success("page")


class Sleeper(Executor):
    """The first READ never answers: it sleeps until the daemon's cancel reaches it
    (`cancelled`); later ones answer SUCCESS."""

    def __init__(self) -> None:
        super().__init__(executor_id="sleeper")
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        if self.started.is_set():
            return Result.success("page")
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover


class Crashing(Executor):
    """The first *crashes* READs raise (an ERROR answer: a CRASH fault); later ones succeed.
    Every envelope received is kept in `seen`."""

    def __init__(self, crashes: int = 1) -> None:
        super().__init__(executor_id="crashing")
        self.crashes = crashes
        self.seen: list[Instruction] = []

    async def read(self, instruction: Instruction) -> Result:
        self.seen.append(instruction)
        if len(self.seen) <= self.crashes:
            raise RuntimeError("the browser fell over")
        return Result.success("page")


# -- the daemon's parts, for real --------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """The files one daemon's lifetimes share: the runtime's root, the store, the socket."""

    runtime: Runtime
    root: Path
    db: Path
    socket: Path


def world_of(runtime: Runtime) -> World:
    """The files of a daemon, under the sandbox runtime's own fresh directory."""
    base = runtime.root.parent
    return World(runtime, runtime.root, base / "turns.sqlite3", base / "ex.sock")


@pytest.fixture
def world(sandbox_runtime: Runtime) -> World:
    """A daemon's files beside the sandbox runtime's root (removed with it)."""
    return world_of(sandbox_runtime)


@dataclass
class Stack:
    """A turn core over a real store, a real hub and the world's runtime."""

    core: TurnCore
    hub: ExecutorHub
    store: TurnStore
    world: World
    _tg: anyio.abc.TaskGroup
    _executors: anyio.abc.TaskGroup
    _scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _stopped: anyio.Event = field(default_factory=anyio.Event)

    async def start_core(self) -> None:
        """Run the core (it first takes back the store's unfinished turns)."""
        await self._tg.start(self._run_core)

    async def _run_core(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            with self._scope:
                await self.core.run(task_status=task_status)
        finally:
            self._stopped.set()

    async def stop_core(self) -> None:
        """Stop the core as a daemon's stop does (the store and the hub stay open)."""
        self._scope.cancel()
        with anyio.fail_after(WAIT_S):
            await self._stopped.wait()

    async def connect(self, executor: Executor) -> None:
        """Connect *executor* to the hub and wait until it is READY."""
        self._executors.start_soon(
            functools.partial(
                run_executor, executor, socket_path=self.world.socket, reconnect=False
            )
        )
        with anyio.fail_after(WAIT_S):
            await self.hub.wait_for_executor(executor.executor_id)

    async def submit(self, sid: str, **params: object) -> TurnRecord:
        """Submit a READ instruction turn (1 s timeout unless *params* say)."""
        request = {
            "session_id": sid,
            "kind": "instruction",
            "command_type": "READ",
            "target_selector": "#main",
            "timeout_ms": 1000,
            "declared_outputs": [],
            **params,
        }
        turn, created = await self.core.submit(submitted(request))
        assert created
        return turn

    async def settled(self, turn_id: int) -> TurnRecord:
        """The turn once it is final (or escalated)."""
        with anyio.fail_after(WAIT_S):
            return await self.core.wait_turn(turn_id, timeout_s=WAIT_S)

    async def reached(self, turn_id: int, state: TurnState) -> TurnRecord:
        """The turn once this daemon saw it reach *state*."""
        with anyio.fail_after(WAIT_S):
            turn = await self.core.wait_turn(turn_id, timeout_s=WAIT_S, until=frozenset({state}))
        assert turn.state is state, turn
        return turn

    async def stored(self, turn_id: int) -> TurnRecord:
        """The turn as the store has it (not this daemon's memory of it)."""
        return await self.store.get_turn(turn_id)


@asynccontextmanager
async def running(
    world: World,
    *executors: Executor,
    retry: RetryOptions = FAST,
    breaker: BreakerLimits | None = None,
    budget: BudgetLimits | None = None,
    start: bool = True,
) -> AsyncIterator[Stack]:
    """One lifetime of a daemon: the hub serving the world's socket with *executors* connected,
    the store open, the core running (unless *start* is false). On the way out the core stops
    first, then the store closes, then the hub (so an answer the hub gives an attempt cut short
    is written nowhere: the next lifetime finds the turn as the stop left it)."""
    hub = ExecutorHub(settings=HubSettings(queue_wait_s=10.0, breaker=breaker or BreakerLimits()))
    listener = await open_executor_listener(world.socket, mode=0o600)
    try:
        async with anyio.create_task_group() as serving, anyio.create_task_group() as connected:
            await serving.start(hub.serve, listener)
            try:
                async with open_sqlite_store(world.db) as store:
                    core = TurnCore(
                        store=store,
                        hub=hub,
                        runtime=world.runtime,
                        settings=CoreSettings(
                            root=world.root,
                            retry=retry,
                            lease_ms=LEASE_MS,
                            retry_budget=budget or BudgetLimits(),
                        ),
                    )
                    async with anyio.create_task_group() as tg:
                        stack = Stack(core, hub, store, world, tg, connected)
                        for executor in executors:
                            await stack.connect(executor)
                        if start:
                            await stack.start_core()
                        yield stack
                        await stack.stop_core()
            finally:  # the store is closed: the hub goes now, and its executors with it
                with anyio.CancelScope(shield=True):
                    await hub.aclose()
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()


async def open_session(stack: Stack) -> str:
    """Open a session of package ``pkg``; its id."""
    return (await stack.core.open_session(package_id="pkg")).session_id


async def accepted_before_restart(world: World) -> tuple[str, int]:
    """A lifetime with no executor: a session and one READ turn, accepted and parked (no slot)
    when the daemon stops. The next lifetime takes it back and runs it in a task."""
    async with running(world) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        assert stack.core.statistics().parked_by_command == {"READ": 1}
    return sid, turn.turn_id


async def sql(world: World, statement: str, *args: object) -> None:
    """Change the store behind the daemon's back (as another daemon, or a failing disk, would)."""

    def run() -> None:
        with sqlite3.connect(world.db) as conn:
            conn.execute(statement, args)
        conn.close()

    await anyio.to_thread.run_sync(run)


async def refuse_endings(world: World, *states: str) -> None:
    """From now on the store's engine refuses to end a turn in any of *states*."""
    listed = ", ".join(f"'{s}'" for s in states)
    await sql(
        world,
        "CREATE TRIGGER refuse_endings BEFORE UPDATE OF state ON turns"
        f" WHEN NEW.state IN ({listed}) BEGIN SELECT RAISE(ABORT, 'the disk is failing'); END",
    )


async def take_over(world: World, turn_id: int) -> None:
    """Another daemon claims the turn: its owner and fencing token move on."""
    await sql(
        world,
        "UPDATE turns SET owner = 'another-daemon', token = token + 1 WHERE turn_id = ?",
        turn_id,
    )


async def exec_entries(stack: Stack, sid: str) -> list[dict[str, Any]]:
    """The session's exec ledger entries of turns (after checking that both ledgers verify)."""
    report = await stack.core.verify_ledgers(session_id=sid)
    assert report["ok"] is True, report
    path = session_dir_for(stack.world.root, "default", sid) / "ledger" / "exec.jsonl"
    text = await anyio.Path(path).read_text()
    entries = [orjson.loads(line) for line in text.splitlines() if line]
    return [e for e in entries if e["kind"] == "turn"]


def events(logs: Iterable[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    """The captured log events called *name*."""
    return [e for e in logs if e["event"] == name]


def result_of(turn: TurnRecord) -> Mapping[str, object]:
    """The turn's result (every ended turn has one)."""
    assert turn.result is not None, turn
    return turn.result


# -- starting turns ------------------------------------------------------------------------------


async def test_a_turn_submitted_before_the_core_runs_is_refused_then_runs_once_it_does(
    world: World,
) -> None:
    """A submit to a core that is not running fails loudly, but the turn it accepted is not
    lost: it waits ``accepted`` in the store and runs to success once the core starts."""
    reader = Reader()
    async with running(world, reader, start=False) as stack:
        sid = await open_session(stack)
        with pytest.raises(RuntimeError, match=r"^the turn core is not running$"):
            await stack.submit(sid)
        (left,) = await stack.core.list_turns(session_id=sid)
        assert left.state is TurnState.ACCEPTED
        await stack.start_core()
        done = await stack.settled(left.turn_id)
        assert done.state is TurnState.SUCCEEDED
        assert [a.decision for a in done.attempts] == ["SUCCEED"]
        assert reader.seen == [f"INS-{left.turn_id}-1"]
        assert [e["status"] for e in await exec_entries(stack, sid)] == ["succeeded"]


async def test_turns_accepted_before_any_executor_connects_run_once_one_does(
    world: World,
) -> None:
    """Turns that find no executor slot wait parked, in order, and run when an executor
    connects; none is attempted before."""
    async with running(world) as stack:
        sid = await open_session(stack)
        turns = [await stack.submit(sid, timeout_ms=30_000) for _ in range(3)]
        assert stack.core.statistics().parked_by_command == {"READ": 3}
        reader = Reader()
        await stack.connect(reader)
        done = [await stack.settled(t.turn_id) for t in turns]
        assert [t.state for t in done] == [TurnState.SUCCEEDED] * 3
        assert reader.seen == [f"INS-{t.turn_id}-1" for t in turns]
        assert stack.core.statistics().parked_by_command == {}


async def test_a_retry_the_open_circuit_keeps_from_an_executor_ends_circuit_open(
    world: World,
) -> None:
    """A retry that cannot go straight to an executor (the pool's circuit breaker opened on
    the first attempt's crash) still runs: in a task, where the hub fails it fast; the turn
    ends ``terminated`` CIRCUIT_OPEN and the executor never sees the second envelope."""
    executor = Crashing()
    breaker = BreakerLimits(faults=1, window_ms=60_000, cooldown_ms=600_000)
    async with running(world, executor, breaker=breaker) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid)
        done = await stack.settled(turn.turn_id)
        assert (done.state, done.reason_code) == (TurnState.TERMINATED, "CIRCUIT_OPEN")
        assert [(a.decision, a.outcome, a.fault_type) for a in done.attempts] == [
            ("RETRY", "FAULT", "CRASH"),
            ("TERMINATE", "CIRCUIT_OPEN", None),
        ]
        assert [i.instruction_id for i in executor.seen] == [f"INS-{turn.turn_id}-1"]
        last = result_of(done)["last_instruction"]
        assert isinstance(last, dict)
        assert last["instruction_id"] == f"INS-{turn.turn_id}-2"
        assert [e["status"] for e in await exec_entries(stack, sid)] == ["terminated"]


# -- after a restart ---------------------------------------------------------------------------


async def test_an_attempt_cut_short_by_a_restart_is_decided_crash_and_retried(
    world: World,
) -> None:
    """The daemon stops while an attempt runs: the next start decides that attempt as a CRASH
    ("interrupted by a restart of this daemon") and retries it under the next number, which
    succeeds."""
    gated = Gated()
    async with running(world, gated) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        await stack.reached(turn.turn_id, TurnState.RUNNING)  # its start is in the store
    assert gated.seen == [f"INS-{turn.turn_id}-1"]
    reader = Reader()
    async with running(world, reader) as stack:
        done = await stack.settled(turn.turn_id)
        assert done.state is TurnState.SUCCEEDED
        first, second = done.attempts
        assert (first.attempt, first.fault_type, first.decision) == (1, "CRASH", "RETRY")
        assert first.detail == (
            "interrupted by a restart of this daemon: it stopped while the attempt ran"
        )
        assert (second.attempt, second.outcome, second.decision) == (2, "SUCCESS", "SUCCEED")
        assert reader.seen == [f"INS-{turn.turn_id}-2"]
        assert [e["status"] for e in await exec_entries(stack, sid)] == ["succeeded"]


async def test_a_result_refused_for_a_lost_claim_leaves_the_turn_to_its_new_owner(
    world: World,
) -> None:
    """Another daemon takes a turn over while this one runs it (in a task, after a restart):
    the store refuses the ending of the answer that then arrives, and the turn is dropped
    here, still ``running`` under its new owner."""
    _, turn_id = await accepted_before_restart(world)
    gated = Gated()
    async with running(world, gated) as stack:
        await stack.reached(turn_id, TurnState.RUNNING)  # its start is in the store
        await take_over(world, turn_id)
        with structlog.testing.capture_logs() as logs:
            gated.gate.set()
            left = await stack.settled(turn_id)
        stored = await stack.stored(turn_id)
        assert events(logs, "stale_result_refused")
        assert events(logs, "turn_finished") == []
        assert left.state is TurnState.RUNNING
        assert (stored.state, stored.owner) == (TurnState.RUNNING, "another-daemon")
        assert stack.core.statistics().turns.turns_active == 0


async def test_an_ending_the_store_refuses_ends_the_turn_terminated_internal_error(
    world: World,
) -> None:
    """The store fails a turn's ending (a task's turn, after a restart): the daemon ends the
    turn itself, ``terminated`` with INTERNAL_ERROR naming the error, its ledgers verifying."""
    sid, turn_id = await accepted_before_restart(world)
    await refuse_endings(world, "succeeded")
    with structlog.testing.capture_logs() as logs:
        async with running(world, Reader()) as stack:
            done = await stack.settled(turn_id)
            statuses = [e["status"] for e in await exec_entries(stack, sid)]
    assert (done.state, done.verdict, done.reason_code) == (
        TurnState.TERMINATED,
        "TERMINATE",
        "INTERNAL_ERROR",
    )
    assert done.reason is not None
    assert done.reason.startswith("IntegrityError: the disk is failing")
    assert [e["error_type"] for e in events(logs, "turn_failed")] == ["IntegrityError"]
    assert statuses[-1] == "terminated"


async def test_a_turn_no_ending_can_be_stored_for_leaves_no_line_and_runs_again_at_next_start(
    world: World,
) -> None:
    """The store fails the turn's ending and then the daemon's own error ending: both are
    logged and this daemon lets the turn go unfinished. Neither ending reaches the ledgers (a
    refused ending is never sealed). The next start (the store working again) runs the turn
    again as an interrupted attempt, and the ledger ends up with exactly one ending for it."""
    sid, turn_id = await accepted_before_restart(world)
    await refuse_endings(world, "succeeded", "terminated")
    with structlog.testing.capture_logs() as logs:
        async with running(world, Reader()) as stack:
            left = await stack.settled(turn_id)
            active = stack.core.statistics().turns.turns_active
            refused = [e["status"] for e in await exec_entries(stack, sid)]
    assert not left.final
    assert active == 0
    assert refused == []  # nothing of the two refused endings is in the ledger
    failures = {"turn_failed", "turn_finish_failed"}
    assert [e["event"] for e in logs if e["event"] in failures] == [
        "turn_failed",
        "turn_finish_failed",
    ]
    await sql(world, "DROP TRIGGER refuse_endings")
    reader = Reader()
    async with running(world, reader) as stack:
        done = await stack.settled(turn_id)
        statuses = [e["status"] for e in await exec_entries(stack, sid)]
    assert done.state is TurnState.SUCCEEDED
    assert statuses == ["succeeded"]
    assert len(reader.seen) == 1


# -- the record path's turns ended by the runner -------------------------------------------------


async def test_an_ending_refused_on_the_record_path_is_ended_by_the_runner_as_an_error(
    world: World,
) -> None:
    """An answered attempt on the record path (no task) whose ending the store fails: the
    runner ends the turn ``terminated`` INTERNAL_ERROR in a task of its own."""
    async with running(world, Reader()) as stack:
        sid = await open_session(stack)
        await refuse_endings(world, "succeeded")
        done = await stack.settled((await stack.submit(sid)).turn_id)
        assert (done.state, done.reason_code) == (TurnState.TERMINATED, "INTERNAL_ERROR")
        assert done.reason is not None
        assert "the disk is failing" in done.reason


async def test_a_cancel_refused_for_a_lost_claim_leaves_the_turn_to_its_new_owner(
    world: World,
) -> None:
    """A cancel of an attempt in flight, after another daemon took the turn over: the
    executor's handler is stopped, the cancel's ending is refused (logged), and the turn stays
    the new owner's, ``running``."""
    sleeper = Sleeper()
    async with running(world, sleeper) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        await stack.reached(turn.turn_id, TurnState.RUNNING)  # its start is in the store
        await take_over(world, turn.turn_id)
        with structlog.testing.capture_logs() as logs:
            with anyio.fail_after(WAIT_S):
                answer = await stack.core.cancel_turn(turn.turn_id)
                await sleeper.cancelled.wait()
        assert answer.state is TurnState.RUNNING
        assert events(logs, "stale_result_refused")
        assert stack.core.statistics().turns.turns_active == 0
        assert (await stack.stored(turn.turn_id)).state is TurnState.RUNNING


async def test_a_cancel_whose_ending_the_store_fails_is_logged_and_the_daemon_serves_on(
    world: World,
) -> None:
    """A cancel of an attempt in flight whose ending the store fails: the executor's handler
    is stopped, the failure logged as ``turn_finish_failed``, the turn left ``running`` as the
    store has it, and the next turn runs."""
    sleeper = Sleeper()
    async with running(world, sleeper) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        await stack.reached(turn.turn_id, TurnState.RUNNING)  # its start is in the store
        await refuse_endings(world, "cancelled")
        with structlog.testing.capture_logs() as logs:
            with anyio.fail_after(WAIT_S):
                answer = await stack.core.cancel_turn(turn.turn_id)
                await sleeper.cancelled.wait()
        assert answer.state is TurnState.RUNNING
        (failed,) = events(logs, "turn_finish_failed")
        assert "the disk is failing" in failed["error"]
        assert stack.core.statistics().turns.turns_active == 0
        await sql(world, "DROP TRIGGER refuse_endings")
        after = await stack.settled((await stack.submit(sid)).turn_id)
        assert after.state is TurnState.SUCCEEDED


async def test_a_cancel_after_the_core_stopped_writes_nothing_for_the_next_start(
    world: World,
) -> None:
    """A cancel that reaches a stopped core (an attempt still in flight) stops the executor's
    handler and lets the turn go without writing anything: the store keeps it unfinished for
    the next start to decide."""
    sleeper = Sleeper()
    async with running(world, sleeper) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        with anyio.fail_after(WAIT_S):
            await sleeper.started.wait()
        await stack.stop_core()
        with anyio.fail_after(WAIT_S):
            answer = await stack.core.cancel_turn(turn.turn_id)
            await sleeper.cancelled.wait()
        assert not answer.final
        assert not (await stack.stored(turn.turn_id)).final
        assert stack.core.statistics().turns.turns_active == 0
        assert await exec_entries(stack, sid) == []


# -- error codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (PackageNotFoundError(package_id="p", path="/nowhere"), "unknown_package"),
        (ManifestError(path="m.json", json_path="$.x", problem="bad"), "bad_manifest"),
        (DeclarationError(field="argv", problem="empty"), "declaration_error"),
        (
            CapabilityViolation(operation="exec", target="/bin/sh", capability="execute"),
            "capability_violation",
        ),
        (SandboxUnavailableError(mechanisms={"landlock": "missing"}), "sandbox_unavailable"),
        (RuntimeError("anything else"), "internal"),
    ],
)
def test_error_code_names_each_sandbox_refusal_and_defaults_for_the_rest(
    exc: Exception, code: str
) -> None:
    """The control API's code for each error the sandbox runtime raises; any other error gets
    the caller's default."""
    assert error_code(exc, default="internal") == code


async def test_a_session_of_a_package_not_installed_is_refused_as_unknown_package(
    world: World,
) -> None:
    """Opening a session of a package the runtime does not have answers ``unknown_package``."""
    async with running(world) as stack:
        with pytest.raises(RequestError) as info:
            await stack.core.open_session(package_id="missing")
    assert info.value.code == "unknown_package"
