"""The client library (`supervisor.client`) against a real daemon: typed values back, typed
exceptions named after the protocol's codes, waits that follow events, paging, the sync
wrapper, the older import paths, and a daemon restart in the middle of a submission."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

import supervisor.client as library
from supervisor.client import (
    Client,
    DecisionRecord,
    IdempotencyConflict,
    SyncClient,
    Turn,
    UnknownSession,
    UnknownTurn,
    connect,
)
from supervisor.client.errors import ERRORS, HunterError
from supervisor.config import load_config
from supervisor.control.server import ERROR_CODES
from supervisor.errors import ControlClientError
from supervisor.sdk import Executor, Instruction, Result
from supervisor.server import Daemon
from tests.live_daemon import WAIT_S, demo_root, serving


class Gated(Executor):
    """READ answers once ``gate`` is set (set from the start unless told otherwise)."""

    def __init__(self, *, open_gate: bool = True) -> None:
        super().__init__(executor_id="gated", slots=16)
        self.gate = anyio.Event()
        if open_gate:
            self.gate.set()

    async def read(self, instruction: Instruction) -> Result:
        await self.gate.wait()
        return Result.success(f"page {instruction.target_selector}")


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-lib-")


def test_every_error_code_of_the_protocol_has_its_exception() -> None:
    """A client can catch each refusal by name; all of them are `HunterError`s and, for the
    code written against the older client, `ControlClientError`s."""
    assert set(ERROR_CODES) <= set(ERRORS)
    assert all(issubclass(kind, HunterError) for kind in ERRORS.values())
    assert issubclass(HunterError, ControlClientError)
    assert set(library.__all__) <= set(dir(library))


async def test_a_turn_submitted_and_awaited_comes_back_typed(root: Path) -> None:
    executor = Gated()
    async with serving(root, executor), connect(root=root) as client:
        session = await client.open_session("demo", tenant="acme")
        assert (session.package_id, session.state, session.tenant) == ("demo", "open", "acme")
        handle = await client.submit_instruction(
            session.session_id, "READ", selector="#title", parameters={"attribute": "x"}
        )
        assert handle.created
        turn = await handle.result(timeout_s=WAIT_S)
        assert isinstance(turn, Turn)
        assert turn.succeeded
        assert turn.final
        assert turn.settled
        assert turn.result is not None
        assert turn.result["executor_id"] == "gated"
        assert [a.decision for a in turn.attempts] == ["SUCCEED"]
        record = await client.decision_record(turn.turn_id)
        assert isinstance(record, DecisionRecord)
        assert record.turn == turn
        assert [e.status for e in record.exec] == ["succeeded"]
        assert len(record.evidence) == 1
        assert (await client.verify_ledgers(session_id=session.session_id)).ok
        assert session.session_id in [s.session_id for s in await client.sessions()]
        assert [e.executor_id async for e in client.executors()] == ["gated"]


async def test_refusals_are_exceptions_named_after_their_codes(root: Path) -> None:
    async with serving(root, Gated()) as (_, sid), connect(root=root) as client:
        with pytest.raises(UnknownTurn) as unknown:
            await client.get_turn(987_654)
        assert unknown.value.code == "unknown_turn"
        with pytest.raises(UnknownSession):
            await client.submit_instruction("SES-nope", "READ", selector="h1")
        first = await client.submit_instruction(sid, "READ", selector="h1", idempotency_key="k1")
        again = await client.submit_instruction(sid, "READ", selector="h1", idempotency_key="k1")
        assert (again.turn_id, again.created) == (first.turn_id, False)
        with pytest.raises(IdempotencyConflict) as conflict:
            await client.submit_instruction(sid, "READ", selector="h2", idempotency_key="k1")
        assert "target_selector" in str(conflict.value.details["fields"])


async def test_as_completed_yields_turns_in_the_order_they_settle(root: Path) -> None:
    """Three turns held by the executor, then let go: each comes back once, as it settles."""
    executor = Gated(open_gate=False)
    async with serving(root, executor) as (_, sid), connect(root=root) as client:
        handles = [await client.submit_instruction(sid, "READ", selector=f"#{i}") for i in range(3)]
        ids = [h.turn_id for h in handles]
        seen: list[int] = []
        async with client.as_completed(ids, timeout_s=WAIT_S) as done:
            executor.gate.set()
            async for turn in done:
                assert turn.succeeded
                seen.append(turn.turn_id)
        assert sorted(seen) == sorted(ids)
        listed = [t.turn_id async for t in client.turns(session_id=sid, page_size=2)]
        assert listed == sorted(ids)  # three turns over two pages


async def test_a_wait_past_its_timeout_raises_timeout_error(root: Path) -> None:
    executor = Gated(open_gate=False)
    async with serving(root, executor) as (_, sid), connect(root=root) as client:
        handle = await client.submit_instruction(sid, "READ", selector="h1")
        with pytest.raises(TimeoutError):
            await handle.result(timeout_s=0.2)
        executor.gate.set()
        assert (await handle.result(timeout_s=WAIT_S)).succeeded


async def test_the_sync_client_does_the_same_from_a_plain_thread(root: Path) -> None:
    async with serving(root, Gated()) as (_, sid):

        def script() -> tuple[Turn, list[Turn]]:
            with SyncClient(root=root) as client:
                turn = client.run_instruction(sid, "READ", selector="h1", timeout_s=WAIT_S)
                ids = [client.submit_instruction(sid, "READ", selector=f"#{i}") for i in range(2)]
                return turn, client.wait_all(ids, timeout_s=WAIT_S)

        turn, both = await anyio.to_thread.run_sync(script)
    assert turn.succeeded
    assert len(both) == 2
    assert all(t.succeeded for t in both)


async def test_a_call_is_sent_again_after_the_daemon_went_away_and_came_back(root: Path) -> None:
    """A client connected to a daemon that then stops: once a daemon serves the root again, a
    submission made with the same key reconnects, is sent again and answers the turn accepted
    before (no second turn). No executor: the turn stays accepted across the restart."""
    config = load_config(None, env={}, overrides={"root": root})
    stopped = anyio.Event()

    async def first_daemon(*, task_status: anyio.abc.TaskStatus[Daemon]) -> None:
        daemon = Daemon(config, handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            task_status.started(daemon)
        stopped.set()

    async with anyio.create_task_group() as tg:
        first_run: Daemon = await tg.start(first_daemon)
        async with Client(config.control_socket, reconnect_s=WAIT_S) as client:
            sid = (await client.open_session("demo")).session_id
            first = await client.submit_instruction(sid, "READ", selector="h", idempotency_key="r1")
            first_run.request_drain()
            with anyio.fail_after(WAIT_S):
                await stopped.wait()
            second_run = Daemon(config, handle_signals=False)
            tg.start_soon(second_run.run)
            again = await client.submit_instruction(sid, "READ", selector="h", idempotency_key="r1")
            second_run.request_drain()
    assert (again.turn_id, again.created) == (first.turn_id, False)
    assert again.turn.state == "accepted"


def test_code_written_against_the_older_paths_keeps_working() -> None:
    from supervisor.client import ControlClient, DaemonNotRunning, socket_for_root
    from supervisor.control.client import ControlClient as Current

    assert ControlClient is Current
    assert issubclass(DaemonNotRunning, Exception)
    assert socket_for_root(Path("/r")) == Path("/r/run/control.sock")


async def test_keys_are_made_up_by_default_and_can_be_left_off(root: Path) -> None:
    """The client gives each submission a key of its own unless told not to (so that it is
    safe to send again after a lost connection); a resubmission under the same key is the
    same turn, with or without waiting; without keys, two submissions are two turns."""
    executor = Gated()
    async with serving(root, executor), connect(root=root) as client:
        sid = (await client.open_session("demo")).session_id
        handle = await client.submit_instruction(sid, "READ", selector="#a")
        turn = await handle.result(timeout_s=WAIT_S)
        key = turn.idempotency_key
        assert key is not None
        assert key.startswith("hc-")
        again = await client.submit_instruction(sid, "READ", selector="#a", idempotency_key=key)
        waited = await client.submit_instruction(
            sid, "READ", selector="#a", idempotency_key=key, wait_s=WAIT_S
        )
        assert (again.created, again.turn_id) == (False, turn.turn_id)
        assert (waited.created, waited.turn_id, waited.turn.succeeded) == (
            False,
            turn.turn_id,
            True,
        )
        async with connect(root=root, auto_keys=False) as plain:
            first = await plain.submit_instruction(sid, "READ", selector="#b")
            second = await plain.submit_instruction(sid, "READ", selector="#b")
        assert first.turn.idempotency_key is None
        assert first.turn_id != second.turn_id
        later = await client.submit_instruction(sid, "READ", selector="#c")
        assert later.turn.idempotency_key is not None
        assert later.turn.idempotency_key > key  # made-up keys sort by the time they were made
