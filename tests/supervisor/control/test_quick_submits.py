"""Submit-and-wait of instruction turns taken without a task (`supervisor.control.submits`).

A real in-process daemon, real control clients on its ``control.sock`` and real SDK executors
on its ``executors.sock``: what a client sees of ``turn.submit`` answered from callbacks (at
once, when the turn settles, or when ``wait_s`` passes first), and of a client that goes away
with answers still owed. No instruction turn escalates through a real executor (only a process
turn's resource exhaustion does), so the escalated-then-read path is not exercised here."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from supervisor.control.client import ControlClient
from supervisor.sdk import Executor, Instruction, Result
from supervisor.wire.frames import FrameReader, encode_frame
from tests.live_daemon import WAIT_S, Gated, Sleeper, demo_root, serving


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package installed; removed afterwards."""
    yield from demo_root("hh-qs-")


def read_params(sid: str, **params: object) -> dict[str, object]:
    """The params of a ``turn.submit`` of a READ instruction turn."""
    return {
        "session_id": sid,
        "kind": "instruction",
        "command_type": "READ",
        "target_selector": "#x",
        "declared_outputs": [],
        **params,
    }


async def submit(client: ControlClient, sid: str, **params: object) -> dict[str, Any]:
    """Submit a READ instruction turn; the whole answer (``turn``, ``created``)."""
    return await client.call("turn.submit", **read_params(sid, **params))


def tasks_named(part: str) -> int:
    """How many running tasks have *part* in their name."""
    return sum(part in (task.name or "") for task in anyio.get_running_tasks())


def served_by_task() -> int:
    """Control requests being served by a task of their own (`Connections._serve_counted`)."""
    names = [task.name or "" for task in anyio.get_running_tasks()]
    return sum("_serve_counted" in name or "_serve_request" in name for name in names)


async def until(predicate: Callable[[], bool]) -> None:
    """Let the event loop run until *predicate()* holds (bound it with ``fail_after``)."""
    while not predicate():
        await anyio.lowlevel.checkpoint()


class Fast(Executor):
    """READ succeeds at once."""

    def __init__(self) -> None:
        super().__init__(executor_id="fast", slots=32)

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page")


async def test_submit_and_waits_in_flight_have_no_task_each(root: Path) -> None:
    """Sixteen submit-and-waits pipelined on one connection, and a keyed one beside them, are
    pending without a task each (a `turn.wait` beside them is, as the control shows); all
    seventeen then succeed."""
    executor = Gated(slots=17, expected=17)
    answers: list[dict[str, Any]] = []
    keyed: list[dict[str, Any]] = []

    async def one(
        client: ControlClient, sid: str, box: list[dict[str, Any]], **params: object
    ) -> None:
        box.append(await submit(client, sid, wait_s=30, **params))

    async with serving(root, executor) as (client, sid):
        assert served_by_task() == 0
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(one, client, sid, answers)
                tg.start_soon(
                    functools.partial(one, client, sid, keyed, idempotency_key="in-the-pass")
                )
                await executor.all_started.wait()
                assert served_by_task() == 0
                # the root's first turn (a fresh store numbers turns from 1), still running
                tg.start_soon(
                    functools.partial(client.call, "turn.wait", turn_id=1, timeout_s=WAIT_S)
                )
                with anyio.fail_after(WAIT_S):
                    await until(lambda: served_by_task() == 1)
                # every request waits for its turn; only the turn.wait has a task of its own
                assert answers == []
                executor.gate.set()
    assert [(a["turn"]["state"], a["created"]) for a in answers] == [("succeeded", True)] * 16
    assert len({a["turn"]["turn_id"] for a in answers}) == 16
    assert (keyed[0]["turn"]["state"], keyed[0]["created"]) == ("succeeded", True)
    assert executor.started == 17


async def test_wait_s_passing_first_answers_the_turn_as_it_is(root: Path) -> None:
    """A turn still running when ``wait_s`` passes is answered then, not final; the turn goes
    on and a cancel ends it."""
    executor = Sleeper()
    async with serving(root, executor) as (client, sid):
        started = anyio.current_time()
        with anyio.fail_after(5):
            answer = await submit(client, sid, wait_s=0.3, timeout_ms=20_000)
        elapsed = anyio.current_time() - started
        turn = answer["turn"]
        assert turn["state"] in {"running", "accepted"}, turn
        assert turn["final"] is False
        assert answer["created"] is True
        assert elapsed >= 0.3
        with anyio.fail_after(WAIT_S):
            await executor.started.wait()
            cancelled = (await client.call("turn.cancel", turn_id=turn["turn_id"]))["turn"]
            await executor.cancelled.wait()
    assert cancelled["state"] == "cancelled"


async def test_client_gone_with_answers_owed(root: Path) -> None:
    """A client that closes its connection with four submit-and-waits unanswered loses only
    those answers: the turns still succeed and the daemon serves everyone else."""
    executor = Gated(slots=4, expected=4)
    async with serving(root, executor) as (client, sid):
        connections = tasks_named("ControlServer._connection")
        opened = await client.call("session.open", package_id="demo")
        other_sid = str(opened["session_id"])
        with anyio.fail_after(WAIT_S):
            async with ControlClient(client.socket_path) as other:
                await until(lambda: tasks_named("ControlServer._connection") == connections + 1)
                async with anyio.create_task_group() as calls:
                    for _ in range(4):
                        calls.start_soon(functools.partial(submit, other, other_sid, wait_s=30))
                    await executor.all_started.wait()
                    listed = await client.call("turns.list", session_id=other_sid)
                    calls.cancel_scope.cancel()  # the client stops waiting ...
            # ... and closes its connection with the four answers owed; the daemon sees it go
            await until(lambda: tasks_named("ControlServer._connection") == connections)
        turn_ids = [t["turn_id"] for t in listed["turns"]]
        assert [t["final"] for t in listed["turns"]] == [False] * 4
        executor.gate.set()
        with anyio.fail_after(WAIT_S):
            ended = [
                (await client.call("turn.wait", turn_id=t, timeout_s=WAIT_S))["turn"]
                for t in turn_ids
            ]
            pong = await client.call("ping")
            after = await submit(client, sid, wait_s=WAIT_S)
    assert [t["state"] for t in ended] == ["succeeded"] * 4
    assert pong["pong"] is True
    assert after["turn"]["state"] == "succeeded"


async def test_pipelined_answers_each_match_their_request(root: Path) -> None:
    """Thirty-two submit-and-waits written in one go on one connection get thirty-two
    answers, each under its own request's id and about its own request's turn."""
    executor = Fast()
    async with serving(root, executor) as (client, sid):
        ids = [f"req-{n}" for n in range(32)]
        frames = b"".join(
            encode_frame(
                {
                    "id": request_id,
                    "op": "turn.submit",
                    "params": read_params(sid, target_selector=f"#{request_id}", wait_s=WAIT_S),
                }
            )
            for request_id in ids
        )
        answers: dict[str, dict[str, Any]] = {}
        with anyio.fail_after(WAIT_S):
            async with await anyio.connect_unix(client.socket_path) as stream:
                await stream.send(frames)
                reader = FrameReader(stream)
                for _ in ids:
                    frame = await reader.read()
                    assert frame["id"] not in answers, frame
                    answers[frame["id"]] = frame
    assert sorted(answers) == sorted(ids)
    for request_id, frame in answers.items():
        assert frame["ok"] is True, frame
        turn = frame["result"]["turn"]
        assert turn["state"] == "succeeded", turn
        assert turn["spec"]["target_selector"] == f"#{request_id}", turn
    assert len({a["result"]["turn"]["turn_id"] for a in answers.values()}) == 32
