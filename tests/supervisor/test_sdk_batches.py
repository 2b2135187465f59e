"""The executor SDK's batched I/O path (supervisor.sdk.connection, slots, messages): a scripted
daemon writes frames the way it likes (many in one write, one split over many) and reads every
answer back."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from sandbox.policy.safety import build_executor_instruction, instruction_to_wire
from supervisor.executors.hub import ExecutorHub, HubSettings, open_executor_listener
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.sdk.executor import utc_timestamp
from supervisor.sdk.inbox import Inbox
from supervisor.sdk.messages import InstructionFrame, decode_frame
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Cancel,
    Welcome,
    instruction_message,
    parse_instruction,
)
from supervisor.wire.frames import FrameReader, encode_frame

TIMEOUT_S = 20


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A short socket path (AF_UNIX paths are limited to 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="hh-sdkb-"))
    try:
        yield directory / "ex.sock"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=["loop callback", "reader task"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the SDK reads: the loop callback (``Inbox``) and the reader task."""
    if request.param == "reader task":
        monkeypatch.setattr(Inbox, "attach", lambda self, stream: False)
    return str(request.param)


def instruction(n: int, *, selector: str = "#x", **parameters: Any) -> bytes:
    """The frame of instruction ``i-<n>`` (READ)."""
    envelope = build_executor_instruction(
        instruction_id=f"i-{n}",
        execution_id="exe-b",
        command_type="READ",
        target_selector=selector,
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=5000,
        parameters=parameters,
    )
    return encode_frame(instruction_message(instruction_to_wire(envelope)))


class Daemon:
    """The daemon's end of one executor connection, scripted by the test."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, max_bytes=4 * 1024 * 1024)

    async def responses(self, count: int) -> list[dict[str, Any]]:
        """The next *count* ``response`` bodies (heartbeats skipped)."""
        answers: list[dict[str, Any]] = []
        with anyio.fail_after(TIMEOUT_S):
            while len(answers) < count:
                frame = await self.reader.read()
                if frame["type"] == "response":
                    answers.append(frame["response"])
        return answers


@asynccontextmanager
async def daemon_at(
    path: Path, **welcome: Any
) -> AsyncIterator[anyio.abc.ObjectReceiveStream[Daemon]]:
    """A listener that says welcome to every executor and hands each connection over."""
    send, receive = anyio.create_memory_object_stream[Daemon](8)
    listener = await anyio.create_unix_listener(path)
    fields: dict[str, Any] = {
        "executor_id": "batch",
        "protocol_version": PROTOCOL_VERSION,
        "heartbeat_interval_ms": 5000,
        "heartbeat_misses": 3,
        "max_frame_bytes": 4 * 1024 * 1024,
    } | welcome

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            daemon = Daemon(stream)
            hello = await daemon.reader.read()
            assert hello["type"] == "hello"
            await stream.send(encode_frame(Welcome(**fields).to_wire()))
            await send.send(daemon)
            await anyio.sleep_forever()

    async with listener, send, receive, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield receive
        tg.cancel_scope.cancel()


class Recorder(Executor):
    """READ: answers its selector; ``#slow`` waits for ``release``; ``#boom`` raises."""

    def __init__(self, *, slots: int = 64) -> None:
        super().__init__(executor_id="batch", slots=slots)
        self.calls: Counter[str] = Counter()
        self.release = anyio.Event()
        self.slow_started = anyio.Event()
        self.slow_cancelled = anyio.Event()
        self.two_waiting = anyio.Event()
        self.reasons: list[str] = []
        self.waiting = 0

    async def on_disconnected(self, reason: str) -> None:
        self.reasons.append(reason)

    async def read(self, instruction: Instruction) -> Result:
        self.calls[instruction.instruction_id] += 1
        selector = instruction.target_selector
        if selector == "#boom":
            raise RuntimeError("boom")
        if selector == "#slow":
            self.slow_started.set()
            self.waiting += 1
            if self.waiting == 2:
                self.two_waiting.set()
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.slow_cancelled.set()
                raise
        size = int(instruction.parameters.get("size", 0))
        return Result.success(selector, output={"text": "y" * size})


@pytest.mark.usefixtures("reading")
async def test_a_chunk_of_many_instructions_is_answered_once_each(socket_path: Path) -> None:
    """256 instructions in one write: each handler runs once and each id is answered once."""
    executor = Recorder()
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        await daemon.stream.send(b"".join(instruction(n) for n in range(256)))
        answers = await daemon.responses(256)
        tg.cancel_scope.cancel()
    ids = Counter(a["instruction_id"] for a in answers)
    assert ids == Counter({f"i-{n}": 1 for n in range(256)})
    assert {a["response_type"] for a in answers} == {"SUCCESS"}
    assert executor.calls == Counter({f"i-{n}": 1 for n in range(256)})


async def test_many_in_flight_through_a_real_hub(socket_path: Path) -> None:
    """64 attempts in flight through the daemon's hub for 512 attempts: every one succeeds and
    every handler ran once."""
    executor = Recorder(slots=64)
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(socket_path)
    outcomes: Counter[str] = Counter()
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        with anyio.fail_after(TIMEOUT_S):
            await hub.wait_for_executor("batch")

        async def lane(k: int) -> None:
            for n in range(k, 512, 64):
                envelope = build_executor_instruction(
                    instruction_id=f"h-{n}", execution_id="exe", command_type="READ",
                    target_selector="#x", timestamp="t", timeout_ms=5000,
                )  # fmt: skip
                report = await hub.run_attempt(envelope)
                outcomes[report.outcome.kind.value] += 1

        with anyio.fail_after(TIMEOUT_S):
            async with anyio.create_task_group() as lanes:
                for k in range(64):
                    lanes.start_soon(lane, k)
        statistics = hub.statistics()
        await hub.aclose()
        await listener.aclose()
        tg.cancel_scope.cancel()
    assert outcomes == Counter({"SUCCESS": 512})
    assert executor.calls == Counter({f"h-{n}": 1 for n in range(512)})
    assert statistics.executors_connected == 1


async def test_a_handler_error_in_a_batch_is_its_own_error(socket_path: Path) -> None:
    """One handler that raises answers ERROR; the others of its chunk answer SUCCESS."""
    executor = Recorder()
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        frames = [instruction(n, selector="#boom" if n == 3 else "#x") for n in range(8)]
        await daemon.stream.send(b"".join(frames))
        answers = {a["instruction_id"]: a for a in await daemon.responses(8)}
        tg.cancel_scope.cancel()
    assert answers["i-3"]["response_type"] == "ERROR"
    assert answers["i-3"]["error_message"] == "RuntimeError: boom"
    assert [answers[f"i-{n}"]["response_type"] for n in range(8) if n != 3] == ["SUCCESS"] * 7


async def test_a_slow_handler_does_not_hold_up_the_others(socket_path: Path) -> None:
    """A handler that waits does not delay the answers of the instructions behind it."""
    executor = Recorder(slots=4)
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        frames = [instruction(0, selector="#slow"), *(instruction(n) for n in range(1, 21))]
        await daemon.stream.send(b"".join(frames))
        fast = await daemon.responses(20)
        assert not executor.release.is_set()
        executor.release.set()
        (slow,) = await daemon.responses(1)
        tg.cancel_scope.cancel()
    assert sorted(a["instruction_id"] for a in fast) == sorted(f"i-{n}" for n in range(1, 21))
    assert slow["instruction_id"] == "i-0"
    assert slow["response_type"] == "SUCCESS"


async def test_slots_bound_the_handlers_running_at_once(socket_path: Path) -> None:
    """With 2 slots and 2 handlers waiting, the third instruction waits for a free slot."""
    executor = Recorder(slots=2)
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        frames = [instruction(0, selector="#slow"), instruction(1, selector="#slow")]
        await daemon.stream.send(b"".join([*frames, instruction(2)]))
        with anyio.fail_after(TIMEOUT_S):
            await executor.two_waiting.wait()
        assert executor.calls["i-2"] == 0
        executor.release.set()
        answers = await daemon.responses(3)
        tg.cancel_scope.cancel()
    assert sorted(a["instruction_id"] for a in answers) == ["i-0", "i-1", "i-2"]


@pytest.mark.usefixtures("reading")
async def test_a_cancel_before_the_handler_runs_answers_timeout(socket_path: Path) -> None:
    """A queued instruction cancelled before a slot is free is answered TIMEOUT, never run."""
    executor = Recorder(slots=1)
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        cancel = encode_frame(Cancel("i-1", "deadline").to_wire())
        await daemon.stream.send(instruction(0, selector="#slow") + instruction(1) + cancel)
        (cancelled,) = await daemon.responses(1)
        executor.release.set()
        (slow,) = await daemon.responses(1)
        tg.cancel_scope.cancel()
    assert cancelled["instruction_id"] == "i-1"
    assert cancelled["response_type"] == "TIMEOUT"
    assert executor.calls["i-1"] == 0
    assert slow["instruction_id"] == "i-0"


@pytest.mark.usefixtures("reading")
async def test_a_disconnect_mid_batch_loses_no_answer_and_repeats_none(socket_path: Path) -> None:
    """The daemon goes away while handlers of a batch wait: they are cancelled, the executor
    reconnects, and the new connection carries no answer of the old one."""
    executor = Recorder()
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        first = await daemons.receive()
        frames = [instruction(n, selector="#slow" if n % 2 else "#x") for n in range(10)]
        await first.stream.send(b"".join(frames))
        answered = await first.responses(5)
        with anyio.fail_after(TIMEOUT_S):
            await executor.slow_started.wait()
        await first.stream.aclose()
        with anyio.fail_after(TIMEOUT_S):
            await executor.slow_cancelled.wait()
        second = await daemons.receive()
        await second.stream.send(instruction(100))
        (after,) = await second.responses(1)
        tg.cancel_scope.cancel()
    assert sorted(a["instruction_id"] for a in answered) == [f"i-{n}" for n in range(0, 10, 2)]
    assert after["instruction_id"] == "i-100"  # nothing of the first connection came first
    assert all(executor.calls[f"i-{n}"] == 1 for n in range(10))


@pytest.mark.usefixtures("reading")
async def test_large_frames_split_over_many_chunks(socket_path: Path) -> None:
    """An instruction frame written a few bytes at a time, and an answer far larger than a
    socket read, both arrive whole."""
    executor = Recorder()
    big = {f"p{k}": "v" * 4000 for k in range(20)}  # about 80 KB of parameters
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        frame = instruction(1, size=300_000, **big) + instruction(2)
        for start in range(0, len(frame), 7_001):
            await daemon.stream.send(frame[start : start + 7_001])
            await anyio.lowlevel.checkpoint()
        answers = {a["instruction_id"]: a for a in await daemon.responses(2)}
        tg.cancel_scope.cancel()
    assert len(answers["i-1"]["output"]["text"]) == 300_000
    assert answers["i-2"]["response_type"] == "SUCCESS"


@pytest.mark.usefixtures("reading")
async def test_an_invalid_instruction_in_a_chunk_is_refused_alone(socket_path: Path) -> None:
    """An instruction that breaks a Phase-20 rule is answered REFUSED; its neighbours run."""
    executor = Recorder()
    bad = instruction_message(
        {"instruction_id": "i-bad", "execution_id": "e", "command_type": "READ",
         "target_selector": "", "timestamp": "t", "timeout_ms": 10}
    )  # fmt: skip
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, reconnect=False))
        daemon = await daemons.receive()
        await daemon.stream.send(instruction(1) + encode_frame(bad) + instruction(2))
        answers = {a["instruction_id"]: a for a in await daemon.responses(3)}
        tg.cancel_scope.cancel()
    assert answers["i-bad"]["response_type"] == "REFUSED"
    assert "target_selector" in answers["i-bad"]["error_message"]
    assert answers["i-1"]["response_type"] == answers["i-2"]["response_type"] == "SUCCESS"
    assert "i-bad" not in executor.calls


# --- the typed decoder never accepts what the Phase-20 rules refuse -------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", " ", "#x", "a\nb", "\u2028", "http://h/", "https://a.b:8080/p", "x" * 1025]
)
_value = st.one_of(_text, st.integers(-(2**54), 2**54), st.booleans(), st.floats(), st.none())
_key = st.sampled_from(
    ["a", "max_items", "maxRetries", "max-retries", "policy", "Decision", "_k", "9x", "a b"]
)
_instruction = st.fixed_dictionaries(
    {
        "instruction_id": st.sampled_from(["i-1", "", "a b", "x" * 129, "-x", "ok.1:2"]),
        "execution_id": st.sampled_from(["e", "", "e\n"]),
        "command_type": st.sampled_from(
            ["READ", "CLICK", "EXTRACT", "SCROLL", "SCREENSHOT", "NAVIGATE", "SHUTDOWN", "read"]
        ),
        "timestamp": st.sampled_from(["t", "", "2026-01-01T00:00:00Z", "t\x00"]),
        "timeout_ms": st.one_of(st.integers(-1, 700_000), st.booleans(), st.just(5000.0)),
    },
    optional={
        "target_url": _text,
        "target_selector": _text,
        "parameters": st.one_of(st.none(), st.dictionaries(_key, _value, max_size=4)),
    },
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(body=_instruction, learn=st.booleans())
def test_the_typed_decoder_agrees_with_the_phase20_rules(body: dict[str, Any], learn: bool) -> None:
    """decode_frame gives the envelope parse_instruction gives, or the same refusal."""
    frame = {"type": "instruction", "instruction": body}
    raw = orjson.dumps(frame)
    try:
        expected = parse_instruction(frame)
    except Exception as exc:
        expected_error: str | None = str(exc)
    else:
        expected_error = None
    if learn:  # the policy accepted these keys before: the fast path may take them
        decode_frame(raw)
    got = decode_frame(raw)
    assert isinstance(got, InstructionFrame)
    if expected_error is not None:
        assert got.envelope is None
        assert str(got.error) == expected_error
    else:
        assert got.envelope == expected


class Odd(Executor):
    """READ: ``#set`` answers an output JSON cannot hold; anything else succeeds."""

    async def read(self, instruction: Instruction) -> Result:
        if instruction.target_selector == "#set":
            return Result.success("x", output={"items": {1, 2}})
        return Result.success("x")


async def test_an_answer_json_cannot_hold_is_an_error_answer(socket_path: Path) -> None:
    """An output that cannot be encoded answers ERROR; the connection and its batch go on."""
    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_executor(Odd(executor_id="odd", slots=4), socket_path=socket_path)
        )
        daemon = await daemons.receive()
        await daemon.stream.send(instruction(1) + instruction(2, selector="#set") + instruction(3))
        answers = {a["instruction_id"]: a for a in await daemon.responses(3)}
        tg.cancel_scope.cancel()
    assert answers["i-2"]["response_type"] == "ERROR"
    assert answers["i-2"]["error_message"].startswith("the response could not be encoded: ")
    assert answers["i-1"]["response_type"] == answers["i-3"]["response_type"] == "SUCCESS"


def test_the_timestamp_is_iso_8601_utc_with_microseconds() -> None:
    """utc_timestamp is what datetime's isoformat gives, with a Z, to the microsecond."""
    before = dt.datetime.now(dt.UTC)
    stamp = utc_timestamp()
    after = dt.datetime.now(dt.UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
    assert before <= dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after


@pytest.mark.usefixtures("reading")
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xff\xff\xff{}", r"^protocol error from the daemon: frame of 4294967295 bytes"),
        (b"\x00\x00\x00\x01{", r"^protocol error from the daemon: frame body of 1 bytes"),
        (b"\x00\x00\x00\x02[]", r"^protocol error from the daemon: frame body is a JSON list"),
        (b"\x00\x00\x00\x10{", r"^protocol error from the daemon: stream ended after 5 bytes"),
        (b"", r"^the daemon closed the connection$"),
    ],
)
async def test_a_broken_stream_ends_the_connection_saying_why(
    socket_path: Path, data: bytes, reason: str
) -> None:
    """A frame that breaks the rules, a stream cut mid-frame, or a clean close ends the
    connection with the reason the executor's on_disconnected is told."""
    executor = Recorder()
    done = anyio.Event()

    async def serve() -> None:
        await run_executor(executor, socket_path=socket_path, reconnect=False)
        done.set()

    async with daemon_at(socket_path) as daemons, anyio.create_task_group() as tg:
        tg.start_soon(serve)
        daemon = await daemons.receive()
        await daemon.stream.send(instruction(1) + data)
        with contextlib.suppress(anyio.BrokenResourceError, OSError):
            await daemon.stream.send_eof()
        with anyio.fail_after(TIMEOUT_S):
            await done.wait()
        tg.cancel_scope.cancel()
    (said,) = executor.reasons
    assert re.match(reason, said), said
