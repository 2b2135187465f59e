"""The dispatcher's running totals (``Dispatcher.free_slots`` and ``connected``): asked on every
turn the core starts, they must not look at every connected executor (with 1,000 idle executors
that sum was a quarter of the daemon's CPU per turn), and they must follow every change of an
executor's load and status exactly as the sum over the executors would."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from supervisor.executors.connection import Connection
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.hub import AttemptReport, ExecutorHub
from supervisor.sdk import Result
from supervisor.wire.executor import Status, response_message
from supervisor.wire.frames import encode_frame
from tests.supervisor.executors.harness import (
    RecordingLog,
    hello_frame,
    hub_settings,
    instruction,
    raw_client,
    running_hub,
)

READ = ExecutorCommandType.READ
CLICK = ExecutorCommandType.CLICK


class _Host:
    """The hub as a connection sees it, reduced to what the dispatcher needs."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.settings = hub_settings()
        self.trace = False
        self.recount = dispatcher.recount
        self.slot_freed = dispatcher.slot_freed

    def changed(self) -> None:
        pass


class _CountingConnection(Connection):
    """A connection that counts how often its free slots are read."""

    __slots__ = ()
    reads: ClassVar[int] = 0

    @property
    def free_slots(self) -> int:
        _CountingConnection.reads += 1
        return super().free_slots


def _connection(
    host: _Host, executor_id: str, commands: tuple[ExecutorCommandType, ...], slots: int
) -> _CountingConnection:
    stream: Any = object()  # never written to: these connections only hold state
    return _CountingConnection(
        executor_id=executor_id,
        commands=commands,
        slots=slots,
        software="test",
        creds=None,
        stream=stream,
        host=host,  # type: ignore[arg-type]  # the protocol's properties are plain attributes
        log=RecordingLog(),
    )


def _naive_free(conns: list[_CountingConnection], command: ExecutorCommandType) -> int:
    return sum(c.free_slots for c in conns if command in c.commands)


async def test_turn_questions_do_not_look_at_idle_executors() -> None:
    """With 1,000 idle executors connected, ``free_slots`` and ``connected`` read none of them;
    a change of one executor reads that executor only, and the totals stay the sum."""
    dispatcher = Dispatcher(notify=lambda: None)
    host = _Host(dispatcher)
    idle = [_connection(host, f"idle-{n}", (READ,), 1) for n in range(1000)]
    busy = _connection(host, "busy", (READ, CLICK), 8)
    for conn in [*idle, busy]:
        dispatcher.add(conn)
    _CountingConnection.reads = 0
    for _ in range(100):
        assert dispatcher.free_slots(READ) == 1008
        assert dispatcher.free_slots(CLICK) == 8
        assert dispatcher.connected(READ) == 1001
        assert dispatcher.connected(ExecutorCommandType.SCROLL) == 0
    assert _CountingConnection.reads == 0

    busy.reserve()
    busy.reserve()
    assert _CountingConnection.reads == 2  # the one executor that changed, once per change
    assert dispatcher.free_slots(READ) == 1006
    assert dispatcher.free_slots(CLICK) == 6
    busy.unreserve()
    assert dispatcher.free_slots(READ) == 1007

    idle[0].disconnect("test", "gone")
    assert dispatcher.connected(READ) == 1000
    assert dispatcher.free_slots(READ) == 1006
    dispatcher.remove(idle[0])
    assert dispatcher.connected(READ) == 1000
    assert dispatcher.free_slots(READ) == _naive_free([*idle[1:], busy], READ) == 1006
    idle[0].unreserve()  # a removed connection changes nothing any more
    assert dispatcher.free_slots(READ) == 1006


async def test_totals_follow_attempts_status_and_disconnects(socket_dir: Path) -> None:
    """Through a real hub: an attempt in flight takes a slot, the executor's own BUSY/READY
    status takes and gives back all of them, a response frees its slot, a queued attempt counts
    against the free slots, and a disconnect removes the executor from both totals."""
    async with running_hub(socket_dir) as h:
        hub = h.hub
        stream, reader = await raw_client(h.socket)
        async with stream:
            hello = hello_frame("tot-1", slots=2, commands=["READ", "CLICK"])
            await stream.send(encode_frame(hello))
            with anyio.fail_after(5):
                assert (await reader.read())["type"] == "welcome"
                await hub.wait_for_executor("tot-1")
            _expect(hub, read=2, click=2, serving=1)

            reports: list[AttemptReport] = []

            async def attempt() -> None:
                reports.append(await hub.run_attempt(instruction()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt)
                with anyio.fail_after(5):
                    first = await reader.read()
                assert first["type"] == "instruction"
                _expect(hub, read=1, click=1, serving=1)

                await _status(stream, hub, ExecutorStatus.BUSY)
                _expect(hub, read=0, click=0, serving=1)
                await _status(stream, hub, ExecutorStatus.READY)
                _expect(hub, read=1, click=1, serving=1)

                tg.start_soon(attempt)
                tg.start_soon(attempt)  # no slot left: it waits in READ's queue
                with anyio.fail_after(5):
                    second = await reader.read()
                await anyio.wait_all_tasks_blocked()
                _expect(hub, read=-1, click=0, serving=1)

                for message in (first, second):
                    iid = message["instruction"]["instruction_id"]
                    body = Result.success(iid).to_wire(iid)
                    await stream.send(encode_frame(response_message(body)))
                with anyio.fail_after(5):
                    third = await reader.read()  # the queued attempt got the freed slot
                    iid = third["instruction"]["instruction_id"]
                    body = Result.success(iid).to_wire(iid)
                    await stream.send(encode_frame(response_message(body)))
            assert [r.outcome.kind for r in reports] == [OutcomeKind.SUCCESS] * 3
            _expect(hub, read=2, click=2, serving=1)
        with anyio.fail_after(5):
            await hub.wait_for_executor("tot-1", status=ExecutorStatus.OFFLINE)
        _expect(hub, read=0, click=0, serving=0)


def _expect(hub: ExecutorHub, *, read: int, click: int, serving: int) -> None:
    assert (hub.free_slots(READ), hub.free_slots(CLICK), hub.serving(READ)) == (
        read,
        click,
        serving,
    )


async def _status(stream: anyio.abc.SocketStream, hub: ExecutorHub, status: ExecutorStatus) -> None:
    await stream.send(encode_frame(Status(status).to_wire()))
    with anyio.fail_after(5):
        await hub.wait_for_executor("tot-1", status=status)
