"""Instruction turns on the record path (`supervisor.turns.flights`), end to end.

A real in-process daemon, a real control client on its ``control.sock`` and real SDK executors
on its ``executors.sock``: what a user sees of turns whose attempts run without a task each
(their outcomes, cancels, retries, deadlines, their ledgers and the store's batching)."""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from supervisor.config import load_config
from supervisor.control.client import ControlClient
from supervisor.logging import configure_logging, reset_logging
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.server import Daemon
from supervisor.store.sqlite import open_sqlite_store
from tests.live_daemon import WAIT_S, Gated, Sleeper, demo_root, serving


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package installed; removed afterwards."""
    yield from demo_root("hh-flt-")


async def submit(client: ControlClient, sid: str, **params: object) -> dict[str, Any]:
    """Submit a READ instruction turn; the turn object of the answer."""
    answer = await client.call(
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type="READ",
        target_selector="#x",
        declared_outputs=[],
        **params,
    )
    return dict(answer["turn"])


async def wait_final(client: ControlClient, turn_id: object) -> dict[str, Any]:
    """The turn once it is final (or escalated)."""
    return dict((await client.call("turn.wait", turn_id=turn_id, timeout_s=WAIT_S))["turn"])


def turn_tasks() -> list[str]:
    """Names of the running tasks that are a turn's own (``turn-<id>``)."""
    names = (task.name or "" for task in anyio.get_running_tasks())
    return [name for name in names if re.fullmatch(r"turn-\d+", name)]


class Flaky(Executor):
    """The first READ raises (an ERROR answer: a CRASH fault); later ones succeed. Each call
    notes the turn tasks running meanwhile (the daemon runs in the same event loop)."""

    def __init__(self) -> None:
        super().__init__(executor_id="flaky")
        self.calls = 0
        self.seen: list[list[str]] = []

    async def read(self, instruction: Instruction) -> Result:
        self.calls += 1
        self.seen.append(turn_tasks())
        if self.calls == 1:
            raise RuntimeError("the browser fell over")
        return Result.success("page")


async def test_many_turns_in_flight_run_without_a_task_each(root: Path) -> None:
    """Sixteen instruction turns in flight at once have no task of their own, and all succeed."""
    executor = Gated(slots=16, expected=16)
    async with serving(root, executor) as (client, sid):
        turns = [await submit(client, sid) for _ in range(16)]
        with anyio.fail_after(WAIT_S):
            await executor.all_started.wait()
        assert turn_tasks() == []
        executor.gate.set()
        with anyio.fail_after(WAIT_S):
            ended = [await wait_final(client, t["turn_id"]) for t in turns]
        assert [t["state"] for t in ended] == ["succeeded"] * 16
        assert [len(t["attempts"]) for t in ended] == [1] * 16
        verified = await client.call("ledger.verify", session_id=sid)
    assert verified["ok"] is True, verified["failures"]
    assert executor.started == 16


async def test_cancel_of_an_attempt_in_flight(root: Path) -> None:
    """A cancel mid-attempt ends the turn cancelled, stops the handler, and the ledgers verify."""
    executor = Sleeper()
    async with serving(root, executor) as (client, sid):
        turn = await submit(client, sid)
        with anyio.fail_after(WAIT_S):
            await executor.started.wait()
            assert turn_tasks() == []  # the attempt is in flight on the record path
            cancelled = (await client.call("turn.cancel", turn_id=turn["turn_id"]))["turn"]
            await executor.cancelled.wait()
        assert cancelled["state"] == "cancelled"
        got = await client.call("turn.get", turn_id=turn["turn_id"])
        verified = await client.call("ledger.verify", session_id=sid)
    assert got["turn"]["state"] == "cancelled"
    ledger = got["ledger"]
    assert [e["status"] for e in ledger["exec"]] == ["cancelled"], ledger
    assert len(ledger["evidence"]) == 1, ledger
    assert verified["ok"] is True, verified["failures"]


async def test_retry_decided_on_the_record_path_continues_and_succeeds(root: Path) -> None:
    """An attempt decided RETRY is recorded, waits out its backoff on the timers and sends the
    next attempt, all without a task: the second attempt succeeds."""
    executor = Flaky()
    async with serving(root, executor, **{"retry.base_delay_ms": 10}) as (client, sid):
        turn = await submit(client, sid)
        with anyio.fail_after(WAIT_S):
            ended = await wait_final(client, turn["turn_id"])
    assert ended["state"] == "succeeded", ended
    first, second = ended["attempts"]
    assert (first["decision"], first["fault_type"]) == ("RETRY", "CRASH")
    assert second["outcome"] == "SUCCESS"
    assert executor.calls == 2
    # neither attempt ran in a task of the turn's own
    assert executor.seen == [[], []]


async def test_cancel_during_a_backoff_ends_the_turn_and_sends_nothing_more(root: Path) -> None:
    """A turn cancelled while it waits out a retry's backoff (on the timers, no task) ends
    `cancelled` at once; its next attempt is never sent."""
    executor = Flaky()
    async with serving(root, executor, **{"retry.base_delay_ms": 30_000}) as (client, sid):
        turn = await submit(client, sid)
        with anyio.fail_after(WAIT_S):
            waiting = await client.call(
                "turn.wait", turn_id=turn["turn_id"], until=["waiting_retry"], timeout_s=WAIT_S
            )
            assert waiting["turn"]["state"] == "waiting_retry", waiting
            assert turn_tasks() == []
            cancelled = await client.call("turn.cancel", turn_id=turn["turn_id"])
    assert cancelled["turn"]["state"] == "cancelled", cancelled
    assert executor.calls == 1


async def test_deadline_on_the_record_path_times_out_and_cancels(root: Path) -> None:
    """An attempt past its timeout_ms ends with a TIMEOUT fault and its handler is cancelled."""
    executor = Sleeper()
    async with serving(root, executor, **{"retry.max_attempts": 1}) as (client, sid):
        turn = await submit(client, sid, timeout_ms=200)
        with anyio.fail_after(WAIT_S):
            await executor.started.wait()
            assert turn_tasks() == []  # the attempt is in flight on the record path
            ended = await wait_final(client, turn["turn_id"])
            await executor.cancelled.wait()
    (attempt,) = ended["attempts"]
    assert attempt["fault_type"] == "TIMEOUT", ended
    assert ended["state"] != "succeeded"


async def test_endings_of_one_pass_commit_together(root: Path) -> None:
    """Turns answered together end in shared commits: more than one store operation a commit."""
    executor = Gated(slots=32, expected=32)
    async with serving(root, executor) as (client, sid):
        turns = [await submit(client, sid) for _ in range(32)]
        with anyio.fail_after(WAIT_S):
            await executor.all_started.wait()
            for t in turns:  # every start is written: only the endings are measured below
                await client.call(
                    "turn.wait", turn_id=t["turn_id"], until=["running"], timeout_s=WAIT_S
                )
        before = (await client.call("status"))["store"]
        executor.gate.set()
        with anyio.fail_after(WAIT_S):
            ended = [await wait_final(client, t["turn_id"]) for t in turns]
        after = (await client.call("status"))["store"]
    assert {t["state"] for t in ended} == {"succeeded"}
    commits = after["commits"] - before["commits"]
    operations = after["operations"] - before["operations"]
    assert operations >= 32
    assert 0 < commits < operations, (before, after)


async def test_a_stop_with_an_attempt_in_flight_writes_nothing_for_it(root: Path) -> None:
    """The daemon stops while an attempt is in flight on the record path (its drain grace runs
    out): the attempt is not recorded (no error logged, nothing written on a store that is
    closing); the turn stays unfinished in the store, for the next start to decide."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream)
    executor = Sleeper()
    config = load_config(None, env={}, overrides={"root": root, "drain_grace_s": 0.2})
    daemon = Daemon(config, handle_signals=False)
    try:
        async with anyio.create_task_group() as executors:
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                executors.start_soon(
                    functools.partial(
                        run_executor, executor, socket_path=config.executor_socket, reconnect=False
                    )
                )
                async with ControlClient(config.control_socket) as client:
                    await client.call("executors.wait", executor_id="sleeper", timeout_s=WAIT_S)
                    sid = (await client.call("session.open", package_id="demo"))["session_id"]
                    turn = await submit(client, str(sid))
                    with anyio.fail_after(WAIT_S):
                        await executor.started.wait()
                daemon.request_drain()  # the executor is still connected, its attempt running
            executors.cancel_scope.cancel()
    finally:
        reset_logging()
    events = [orjson.loads(line) for line in stream.getvalue().splitlines() if line]
    assert any(e["event"] == "drain_finished" and e["clean"] is False for e in events)
    loud = [e for e in events if e["level"] in {"error", "critical", "exception"}]
    assert loud == []
    async with open_sqlite_store(config.intake_path) as store:
        left = await store.get_turn(int(turn["turn_id"]))
    assert not left.final
