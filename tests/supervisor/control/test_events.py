"""The change feed on ``control.sock`` (``events.subscribe``, `supervisor.feed`).

A real in-process daemon, real SDK executors, and subscribers on raw control connections, as
a client library or ``hunter events`` would hold them: what a subscriber sees of turns and
executors, how it resumes after reconnecting, what it is told when its cursor cannot be
honoured, and what happens to one that stops reading while a hundred others follow along."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest

from supervisor.control.client import ControlClient
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.wire.frames import FrameReader, encode_frame
from tests.live_daemon import WAIT_S, demo_root, serving


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-ev-")


class Fast(Executor):
    """READ succeeds at once."""

    def __init__(self, executor_id: str = "fast") -> None:
        super().__init__(executor_id=executor_id, slots=32)

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page")


def read_params(sid: str) -> dict[str, object]:
    return {
        "session_id": sid,
        "kind": "instruction",
        "command_type": "READ",
        "target_selector": "#x",
        "declared_outputs": [],
        "wait_s": WAIT_S,
        "answer": "compact",
    }


class Stream:
    """One raw control connection holding subscriptions."""

    def __init__(self, conn: anyio.abc.SocketStream) -> None:
        self.conn = conn
        self.reader = FrameReader(conn)

    async def send(self, frame: dict[str, object]) -> None:
        await self.conn.send(encode_frame(frame))

    async def frame(self) -> dict[str, Any]:
        with anyio.fail_after(WAIT_S):
            body = await self.reader.read_body()
        got: dict[str, Any] = orjson.loads(body)
        return got

    async def subscribe(self, rid: object = 1, **params: object) -> dict[str, Any]:
        await self.send({"id": rid, "op": "events.subscribe", "params": params})
        return await self.frame()

    async def events_until(self, done: Any) -> list[dict[str, Any]]:
        """Event frames' events until *done(event)* holds for one (included)."""
        seen: list[dict[str, Any]] = []
        while True:
            frame = await self.frame()
            assert "event" in frame, frame
            seen.append(frame["event"])
            if done(frame["event"]):
                return seen


@asynccontextmanager
async def stream(path: Path) -> AsyncIterator[Stream]:
    conn = await anyio.connect_unix(path)
    async with conn:
        yield Stream(conn)


def control_socket(client: ControlClient) -> Path:
    return Path(client.socket_path)


async def test_a_subscriber_sees_a_turn_from_accept_to_end_in_order(root: Path) -> None:
    """Subscribed to a session, a client sees its turn accepted, its attempt start and end,
    and its ending, in that order, with cursors that only grow; a turn of another session
    is not sent to it."""
    async with serving(root, Fast()) as (client, sid):
        other = str((await client.call("session.open", package_id="demo"))["session_id"])
        async with stream(control_socket(client)) as sub:
            ack = await sub.subscribe(sessions=[sid])
            assert ack["ok"]
            assert ack["result"]["subscribed"]
            assert ack["result"]["gap"] is None
            await client.call("turn.submit", **read_params(other))
            turn = (await client.call("turn.submit", **read_params(sid)))["turn"]
            events = await sub.events_until(lambda e: e["kind"] == "turn.ended")
    assert [e["kind"] for e in events] == [
        "turn.accepted",
        "attempt.started",
        "attempt.ended",
        "turn.ended",
    ]
    assert {e["turn_id"] for e in events} == {turn["turn_id"]}
    assert {e["session_id"] for e in events} == {sid}
    assert events[-1]["state"] == "succeeded"
    assert events[2]["decision"] == "SUCCEED"
    assert events[2]["executor_id"] == "fast"
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)


async def test_a_client_that_resumes_after_its_cursor_misses_nothing_and_sees_nothing_twice(
    root: Path,
) -> None:
    """A subscriber that reconnects with the last cursor it saw gets every event it missed
    meanwhile, once, before the live ones."""
    async with serving(root, Fast()) as (client, sid):
        path = control_socket(client)
        async with stream(path) as sub:
            await sub.subscribe(sessions=[sid])
            await client.call("turn.submit", **read_params(sid))
            first = await sub.events_until(lambda e: e["kind"] == "turn.ended")
        missed = [(await client.call("turn.submit", **read_params(sid)))["turn"] for _ in range(3)]
        async with stream(path) as sub:
            ack = await sub.subscribe(sessions=[sid], after=first[-1]["cursor"])
            assert ack["result"]["gap"] is None
            assert ack["result"]["replayed"] == 12
            last_id = missed[-1]["turn_id"]
            again = await sub.events_until(
                lambda e: e["kind"] == "turn.ended" and e["turn_id"] == last_id
            )
    assert [e["turn_id"] for e in again if e["kind"] == "turn.ended"] == [
        t["turn_id"] for t in missed
    ]
    assert len(again) == 12
    assert min(e["seq"] for e in again) == first[-1]["seq"] + 1


async def test_a_cursor_the_daemon_cannot_honour_is_answered_with_a_gap(root: Path) -> None:
    """A cursor of another run of the daemon (it restarted) is not an error: the answer says
    there is a gap (re-read what you follow), and the live events follow."""
    async with serving(root, Fast()) as (client, sid), stream(control_socket(client)) as sub:
        ack = await sub.subscribe(sessions=[sid], after="0ldrun00:41")
        assert ack["ok"]
        assert "another run of the daemon" in ack["result"]["gap"]
        await client.call("turn.submit", **read_params(sid))
        events = await sub.events_until(lambda e: e["kind"] == "turn.ended")
        assert events[0]["kind"] == "turn.accepted"


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"kinds": ["turn.endd"]}, "kinds", "unknown event kinds ['turn.endd']"),
        ({"after": "nonsense"}, "after", "expected '<epoch>:<seq>'"),
    ],
)
async def test_a_bad_subscription_is_refused_naming_what_was_wrong(
    root: Path, params: dict[str, object], field: str, words: str
) -> None:
    async with serving(root, Fast()) as (client, _), stream(control_socket(client)) as sub:
        answer = await sub.subscribe(**params)
        assert answer["ok"] is False
        assert answer["error"]["code"] == "bad_request"
        assert answer["error"]["field"] == field
        assert words in answer["error"]["message"]
        assert (await client.call("ping"))["pong"]  # the connection and the daemon go on


async def test_executors_connecting_and_leaving_are_events(root: Path) -> None:
    """A subscriber to executor events sees an executor connect, with its command types,
    and go when it disconnects."""
    async with serving(root, Fast()) as (client, _), stream(control_socket(client)) as sub:
        await sub.subscribe(kinds=["executor.connected", "executor.gone"])
        status = await client.call("ping")
        assert status["pong"]
        second = Fast("second")
        socket_path = control_socket(client).parent / "executors.sock"
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(run_executor, second, socket_path=socket_path, reconnect=False)
            )
            connected = await sub.events_until(lambda e: e["executor_id"] == "second")
            tg.cancel_scope.cancel()
        gone = await sub.events_until(lambda e: e["kind"] == "executor.gone")
    assert connected[-1]["kind"] == "executor.connected"
    assert "READ" in connected[-1]["command_types"]
    assert gone[-1]["executor_id"] == "second"


@pytest.mark.slow  # a hundred subscribers: seconds, not the quick tier's milliseconds
async def test_a_stalled_subscriber_is_cut_off_while_a_hundred_others_see_every_turn(
    root: Path,
) -> None:
    """With 100 subscribers, one of which never reads, the daemon goes on serving: once the
    stalled one's connection holds its writer's limit it is cut off (``status`` counts it), the
    99 others see every turn end, and the stalled client, when it finally reads, finds its
    events, then why it was cut off and the cursor to resume from."""
    async with serving(root, Fast()) as (client, sid):
        path = control_socket(client)
        stalled = await anyio.connect_unix(path)
        raw_socket = stalled.extra(anyio.abc.SocketAttribute.raw_socket)
        raw_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await stalled.send(encode_frame({"id": 7, "op": "events.subscribe", "params": {}}))
        submitted = [0]
        stopping: list[bool] = []
        target: list[int] = []
        seen: list[int] = []
        followers_ready = anyio.Event()
        ready = [0]

        async def follower() -> None:
            async with stream(path) as sub:
                await sub.subscribe(kinds=["turn.ended"])
                ready[0] += 1
                if ready[0] == 99:
                    followers_ready.set()
                count = 0
                with anyio.fail_after(WAIT_S * 6):
                    while not target or count < target[0]:
                        with anyio.move_on_after(0.5):  # to look at the target again
                            frame = await sub.frame()
                            assert frame["event"]["kind"] == "turn.ended"
                            count += 1
                seen.append(count)

        async def cut_off() -> bool:
            return bool((await client.call("status"))["events"]["cut_off"])

        async with anyio.create_task_group() as tg:
            for _ in range(99):
                tg.start_soon(follower)
            with anyio.fail_after(WAIT_S):
                await followers_ready.wait()

            async def lane() -> None:
                async with ControlClient(path) as own:
                    while not stopping:
                        await own.call("turn.submit", **read_params(sid))
                        submitted[0] += 1

            async with anyio.create_task_group() as lanes:
                for _ in range(32):
                    lanes.start_soon(lane)
                for _ in range(600):  # the daemon's status is where a cut shows
                    if await cut_off():
                        break
                    await anyio.sleep(0.2)
                else:
                    pytest.fail("the stalled subscriber was never cut off")
                stopping.append(True)  # the lanes stop after their turn in hand
            target.append(submitted[0])
        assert seen == [submitted[0]] * 99
        status = await client.call("status")
        assert status["events"]["cut_off"] == 1
        assert status["events"]["subscribers"] == 0  # the followers left, the stalled one cut
        raw = b""
        with anyio.fail_after(WAIT_S):
            while b"subscriber_too_slow" not in raw:
                raw += await stalled.receive(1 << 20)
        await stalled.aclose()
    assert raw[4:].startswith(b'{"id":7,"ok":true')  # its subscription was acknowledged first
    assert b'"code":"subscriber_too_slow"' in raw
    assert b'"resume_after":"' in raw
    assert len(raw) < 3 * 1024 * 1024  # the limit (1 MiB), a last batch and the kernel's buffers
