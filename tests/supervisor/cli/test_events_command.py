"""`hunter events` (issue 21): a ``tail -f`` of the daemon's change feed, and `hunter turn wait`
following a turn's events instead of asking again and again."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from supervisor.cli import main
from supervisor.control.client import ControlClient
from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import WAIT_S, demo_root, serving


class Gated(Executor):
    """READ waits for ``gate``: the turn is running until the test lets it end."""

    def __init__(self) -> None:
        super().__init__(executor_id="gated", slots=4)
        self.started = anyio.Event()
        self.gate = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        self.started.set()
        await self.gate.wait()
        return Result.success("page")


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-evc-")


async def until_subscribed(client: ControlClient) -> None:
    """Until the command under test follows the feed (the daemon's status counts it)."""
    for _ in range(int(WAIT_S / 0.02)):
        if (await client.call("status"))["events"]["subscribers"]:
            return
        await anyio.sleep(0.02)
    pytest.fail("the command never subscribed")


async def hunter(*argv: str) -> int:
    """Run `hunter ARGV` in a worker thread (it starts its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(main, list(argv)))


async def test_events_prints_a_turns_life_as_json_lines(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hunter events --session S --count 4 --json` prints one JSON object per line: the turn
    accepted, its attempt started and ended, the turn ended."""
    executor = Gated()
    executor.gate.set()
    async with serving(root, executor) as (client, sid), anyio.create_task_group() as tg:
        codes: list[int] = []

        async def follow() -> None:
            codes.append(
                await hunter(
                    "events", "--root", str(root), "--session", sid, "--count", "4", "--json"
                )
            )

        tg.start_soon(follow)
        await until_subscribed(client)
        await client.call(
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="READ",
            target_selector="#x",
            declared_outputs=[],
            wait_s=WAIT_S,
        )
    assert codes == [0]
    lines = capsys.readouterr().out.strip().splitlines()
    events = [orjson.loads(line) for line in lines if line.startswith("{")]  # not the daemon's
    assert [e["kind"] for e in events] == [
        "turn.accepted",
        "attempt.started",
        "attempt.ended",
        "turn.ended",
    ]
    assert events[-1]["state"] == "succeeded"


async def test_turn_wait_follows_the_turns_events_to_its_end(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hunter turn wait N` on a running turn reports it running, then its end, as it happens
    (the turn ends only once the wait is following it), and exits 0 for a success."""
    executor = Gated()
    async with serving(root, executor) as (client, sid):
        answer = await client.call(
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="READ",
            target_selector="#x",
            declared_outputs=[],
        )
        turn_id = answer["turn"]["turn_id"]
        with anyio.fail_after(WAIT_S):
            await executor.started.wait()
        async with anyio.create_task_group() as tg:
            codes: list[int] = []

            async def wait() -> None:
                codes.append(await hunter("turn", "wait", str(turn_id), "--root", str(root)))

            tg.start_soon(wait)
            progress = ""
            for _ in range(int(WAIT_S / 0.02)):  # until the command reports the running turn
                progress += capsys.readouterr().err
                if f"turn {turn_id}: running (attempt 1)" in progress:
                    break
                await anyio.sleep(0.02)
            else:
                pytest.fail(f"no progress line for the running turn: {progress!r}")
            executor.gate.set()
    assert codes == [0]
    assert f"turn {turn_id}: succeeded" in capsys.readouterr().err
