"""Fuzz: structure-aware mutations of a valid example of every message, at every decoder.

A valid control request of every operation, every executor message and every sandbox helper
request and reply is mutated one place at a time (`tests.fuzz.mutations`: bytes that are not
UTF-8, lone surrogates, NUL, huge numbers, wrong types, deep nesting, long strings, lying
MessagePack headers) and byte by byte. Every body goes to every decoder of untrusted frames,
whatever its format (a peer may send anything): each returns a message or raises its
documented error, nothing else (issue 19: a string holding ``\\xc0`` raised
``UnicodeDecodeError`` and killed the daemon), and an error or message the daemon can answer.

Over real sockets, a seeded sample of them goes to an in-process daemon's control.sock and
executors.sock (as a hello, and after one), each on a fresh connection: every frame gets the
answer its decoding calls for, and the daemon still answers ``status`` afterwards.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, NamedTuple

import anyio
import anyio.from_thread
import msgspec
import pytest

from sandbox.enumerate import RealizedWrite, SurfaceProblem
from sandbox.helper import wire as helper
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.faults import ExecutionFaultType
from sandbox.promote import PromotedOutput
from sandbox.runs import ProcessAttempt
from supervisor.config import Config, load_config
from supervisor.control.client import ControlClient
from supervisor.demo.stack import prepare_root
from supervisor.errors import ProtocolError
from supervisor.server import Daemon
from supervisor.wire import control, executor
from supervisor.wire.frames import FrameDecodeError, FrameReader, decode_body, encode_frame
from tests.fuzz.mutations import (
    Mutation,
    byte_mutations,
    encode_json,
    encode_msgpack,
    json_mutations,
    msgpack_mutations,
)

SID: Final = "SES-20260101T000000.000000Z-0123456789abcdef"
HASH: Final = hashlib.sha256(b"Welcome").hexdigest()

# --- valid examples ----------------------------------------------------------------------------

#: One valid request per control operation (turn.submit twice: instruction and process), every
#: optional field filled.
CONTROL: Final[dict[str, dict[str, Any]]] = {
    "ping": {"id": 1, "op": "ping", "params": {}},
    "session.open": {
        "id": "req-2",
        "op": "session.open",
        "params": {
            "package_id": "fuzz-absent",  # no such package: a valid one opens nothing
            "tier": "default",
            "work_order_id": "WO-1",
            "workspace": "/srv/work",
            "tenant": "team-a",
            "priority": 3,
        },
    },
    "session.close": {"id": 3, "op": "session.close", "params": {"session_id": SID}},
    "session.list": {"id": 4, "op": "session.list", "params": {}},
    "turn.submit instruction": {
        "id": 5,
        "op": "turn.submit",
        "params": {
            "session_id": SID,
            "kind": "instruction",
            "declared_outputs": ["out.txt", {"path": "report.md", "role": "report"}],
            "declared_inputs": ["in.txt"],
            "phase": "GREEN",
            "idempotency_key": "key-1",
            "timeout_ms": 30_000,
            "wait_s": 1.5,
            "command_type": "READ",
            "target_url": "https://example.com/",
            "target_selector": "#main",
            "parameters": {"mode": "text", "limit": 10, "strict": True},
            "argv": ["unused"],
            "traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
        },
    },
    "turn.submit process": {
        "id": 6,
        "op": "turn.submit",
        "params": {
            "session_id": SID,
            "kind": "process",
            "declared_outputs": [{"path": "out.txt", "role": "output"}, "tmp/**"],
            "declared_inputs": ["src/main.py"],
            "phase": "RED",
            "idempotency_key": "key-2",
            "timeout_ms": 600_000,
            "wait_s": 0,
            "command_type": "EXTRACT",
            "target_url": "",
            "target_selector": "",
            "parameters": {"a": "b"},
            "argv": ["/bin/sh", "-c", "echo hi > out.txt"],
            "traceparent": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-00",
        },
    },
    "turn.get": {"id": 7, "op": "turn.get", "params": {"turn_id": 7}},
    "turn.evidence": {
        "id": 17,
        "op": "turn.evidence",
        "params": {"turn_id": 7, "offset": 0, "length": 4096},
    },
    "session.get": {"id": 18, "op": "session.get", "params": {"session_id": "SES-x"}},
    "turn.wait": {
        "id": 8,
        "op": "turn.wait",
        "params": {"turn_id": "8", "timeout_s": 2.5, "until": ["succeeded", "failed"]},
    },
    "turn.cancel": {"id": 9, "op": "turn.cancel", "params": {"turn_id": 9}},
    "turns.list": {
        "id": 10,
        "op": "turns.list",
        "params": {"session_id": SID, "after_turn_id": 3, "limit": 50},
    },
    "status": {"id": 11, "op": "status", "params": {}},
    "executors.list": {
        "id": 12,
        "op": "executors.list",
        "params": {"after_executor_id": "web-0", "limit": 10},
    },
    "executors.wait": {
        "id": 13,
        "op": "executors.wait",
        "params": {"executor_id": "web-1", "status": "READY", "timeout_s": 1.0},
    },
    "escalations.list": {"id": 14, "op": "escalations.list", "params": {}},
    "escalations.resolve": {
        "id": 15,
        "op": "escalations.resolve",
        "params": {"turn_id": 15, "action": "retry", "reason": "disk freed"},
    },
    "ledger.verify": {"id": 16, "op": "ledger.verify", "params": {"session_id": SID}},
    "drain": {"id": None, "op": "drain", "params": {}},
    "events.subscribe": {
        "id": 17,
        "op": "events.subscribe",
        "params": {"sessions": [SID], "kinds": ["turn.ended"], "after": "a1b2c3d4:0"},
    },
    "events.unsubscribe": {"id": 18, "op": "events.unsubscribe", "params": {"subscription": 17}},
}

#: One valid message of each kind an executor sends (docs/protocol.md section 3).
EXECUTOR: Final[dict[str, dict[str, Any]]] = {
    "hello": {
        "type": "hello",
        "executor_id": "web-1",
        "protocol_version": 1,
        "commands": ["READ", "NAVIGATE"],
        "slots": 2,
        "software": "sdk/1.0",
    },
    "response": {
        "type": "response",
        "evidence": base64.b64encode(b"Welcome").decode(),
        "response": {
            "instruction_id": "T-17.a1",
            "response_type": "SUCCESS",
            "evidence_hash": HASH,
            "error_message": "",
            "timestamp": "2026-01-01T00:00:00.120000Z",
            "output": {"text": "Welcome"},
            "partial": False,
            "retry_after_ms": None,
        },
    },
    "heartbeat": {"type": "heartbeat", "ts_us": 1_767_225_600_000_000},
    "status": {"type": "status", "status": "BUSY", "detail": "warming up"},
}

_DECLARED = (DeclaredOutput("out.txt"), DeclaredOutput("tmp/**", "scratch"))
_WRITE = RealizedWrite(area="output", path="out.txt", sha256=HASH, size=7, inode=12, device=3)
_PROBLEM = SurfaceProblem(area="output", path="link", kind="symlink")

#: Every sandbox helper request.
HELPER_REQUESTS: Final[tuple[helper.Request, ...]] = (
    helper.Hello(),
    helper.Reset(owner="/var/lib/hunter"),
    helper.Open(
        session=helper.SessionSpec(
            session_id=SID,
            package_id="demo",
            package_dir="/var/lib/hunter/installed/demo",
            manifest={"capabilities": {"read": ["input/**"]}, "limits": {"pids": 64}},
            workspace="/srv/work",
            forbidden=("/var/lib/hunter/control.sock",),
            env={"LANG": "C.UTF-8"},
            owner="/var/lib/hunter",
        )
    ),
    helper.Confine(session_id=SID),
    helper.Run(
        session_id=SID,
        exe="/bin/sh",
        argv=("sh", "-c", "echo hi > out.txt"),
        declared=_DECLARED,
        turn=4,
        attempt_no=2,
        timeout_s=30.5,
    ),
    helper.Promote(session_id=SID, paths=("out.txt", "b/c.txt"), workspace="/srv/work"),
    helper.Empty(session_id=SID),
    helper.Close(session_id=SID),
)

#: Every sandbox helper reply.
HELPER_REPLIES: Final[tuple[helper.Reply, ...]] = (
    helper.Welcome(
        version=1,
        levels={"filesystem": "landlock", "network": "netns"},
        missing={"seccomp": "not built"},
        root="/var/lib/hunter-helper",
    ),
    helper.Opened(tmp_dir="/run/h/tmp", output_dir="/run/h/out", uid=61_000, gid=61_000),
    helper.Levels(levels={"filesystem": "landlock"}),
    helper.Ran(
        levels={"filesystem": "landlock"},
        record=ProcessAttempt(
            attempt_number=2,
            exit_code=1,
            signal=None,
            timed_out=False,
            resource_exhausted=False,
            security_violation=True,
            outcome="FAULT",
            fault_type="SECURITY_VIOLATION",
            verdict="TERMINATE",
            reason_code="WRITE_SURFACE",
            reason="a symlink in output",
            delay_ms=0,
            duration_ms=120,
            stdout="hi\n",
            stderr="",
            stdout_truncated=False,
            stderr_truncated=True,
            leftover_processes=0,
            resource_events={"oom_kill": 0},
            realized_writes=(_WRITE,),
            problems=(_PROBLEM,),
            launcher="native",
            started_us=1_767_225_600_000_000,
        ),
        outcome=AttemptOutcome.fault(ExecutionFaultType.SECURITY_VIOLATION, "symlink"),
        writes=(_WRITE,),
        problems=(_PROBLEM,),
        violations=(
            helper.Violation(
                operation="write",
                target="/etc/passwd",
                capability="write",
                session_id=SID,
                turn_number=4,
                detail="denied",
            ),
        ),
    ),
    helper.Promoted(
        outputs=(
            PromotedOutput(path="out.txt", destination="workspace/out.txt", sha256=HASH, size=7),
        )
    ),
    helper.Done(),
    helper.Failed(kind="os", message="No such file", errno=2),
)

# --- the decoders and their documented errors --------------------------------------------------


def _control_ok(value: object) -> bool:
    """A typed request whose id the answer can carry (orjson writes 64-bit integers only)."""
    if not isinstance(value, msgspec.Struct) or not hasattr(value, "id"):
        return False
    encode_frame({"id": value.id, "ok": True, "result": {}})
    return control.op_of(value) in control.OPERATIONS  # type: ignore[arg-type]


def _answerable(exc: BaseException, body: bytes) -> None:
    """The error becomes the answer the server sends: it must encode (orjson refuses
    surrogates and integers beyond 64 bits)."""
    if isinstance(exc, control.RequestDecodeError):
        encode_frame({"id": exc.request_id, "ok": False, "error": exc.to_wire()})
    elif isinstance(exc, ProtocolError):
        encode_frame(executor.Reject(exc.reason_code, exc.reason).to_wire())
        decode_body(body)  # the reception reads the executor_id of a refused hello from it
    elif isinstance(exc, FrameDecodeError):
        encode_frame({"id": None, "ok": False, "error": {"message": exc.reason}})


class _Target(NamedTuple):
    decode: Callable[[bytes], object]
    #: the documented errors
    errors: tuple[type[Exception], ...]
    #: whether a value it returned is a message of the right type (and can be answered)
    is_message: Callable[[object], bool]


#: Every decoder of untrusted frame bodies.
DECODERS: Final[dict[str, _Target]] = {
    "control request": _Target(
        control.decode_request,
        (control.RequestDecodeError, FrameDecodeError),
        _control_ok,
    ),
    "frame body": _Target(decode_body, (FrameDecodeError,), lambda v: isinstance(v, dict)),
    "executor hello": _Target(
        executor.decode_hello,
        (FrameDecodeError, ProtocolError),
        lambda v: isinstance(v, executor.Hello),
    ),
    "executor message": _Target(
        executor.decode_executor_message,
        (FrameDecodeError, executor.MessageError),
        lambda v: isinstance(v, executor.ResponseMessage | executor.Heartbeat | executor.Status),
    ),
    "helper request": _Target(
        helper.decode_request,
        (helper.HelperWireError,),
        lambda v: isinstance(v, helper.Request),
    ),
    "helper reply": _Target(
        helper.decode_reply,
        (helper.HelperWireError,),
        lambda v: isinstance(v, helper.Reply),
    ),
}


def _feed(mutations: Iterable[Mutation], counts: Counter[str]) -> None:
    """Every mutation to every decoder: a message of the right type or a documented error."""
    for mutation in mutations:
        body = mutation.body
        for name, (decode, errors, is_message) in DECODERS.items():
            counts[name] += 1
            where = f"{decode.__module__}.{getattr(decode, '__name__', name)}"
            try:
                value = decode(body)
            except errors as exc:
                try:
                    _answerable(exc, body)
                except Exception as bad:
                    pytest.fail(
                        f"{where}: its error cannot be answered ({bad!r}) on {mutation.show()}"
                    )
                continue
            except Exception as exc:
                pytest.fail(f"{where} raised {exc!r} on {mutation.show()}")
            try:
                good = is_message(value)
            except Exception as bad:
                pytest.fail(
                    f"{where}: its result cannot be answered ({bad!r}) on {mutation.show()}"
                )
            if not good:
                pytest.fail(f"{where} returned {value!r} on {mutation.show()}")


def _all_mutations(family: str, message: object, *, count: int) -> Iterator[Mutation]:
    """Structured mutations in both formats, then byte mutations of both valid encodings."""
    yield from json_mutations(message)
    yield from msgpack_mutations(message)
    for encode in (encode_json, encode_msgpack):
        body = encode(message)
        yield Mutation(f"valid {encode.__name__}", body)
        rng = random.Random(f"{family}:{encode.__name__}")  # a str seed: stable across runs
        yield from byte_mutations(body, rng, count=count)


def _report(
    family: str,
    counts: Counter[str],
    record: Callable[..., None],
    record_property: Callable[[str, object], None],
    *,
    minimum: int,
) -> None:
    for name in DECODERS:
        record(f"structured {family}: {name}", counts[name], minimum=minimum)
        record_property(f"{family}:{name}", counts[name])


# --- the tests ---------------------------------------------------------------------------------


def test_examples_are_valid() -> None:
    """Every example decodes with its own decoder (mutations of invalid ones would prove
    little), and every control operation has one."""
    for request in CONTROL.values():
        assert control.op_of(control.decode_request(encode_json(request))) == request["op"]
    assert {request["op"] for request in CONTROL.values()} == set(control.OPERATIONS)
    assert executor.decode_hello(encode_json(EXECUTOR["hello"])).executor_id == "web-1"
    response = executor.decode_executor_message(encode_json(EXECUTOR["response"]))
    assert isinstance(response, executor.ResponseMessage)
    assert response.evidence == EXECUTOR["response"]["evidence"]
    for name in ("heartbeat", "status"):
        message = executor.decode_executor_message(encode_json(EXECUTOR[name]))
        assert isinstance(message, executor.Heartbeat | executor.Status)
        assert message.to_wire() == EXECUTOR[name]
    for helper_request in HELPER_REQUESTS:
        body = encode_msgpack(msgspec.to_builtins(helper_request))
        assert helper.decode_request(body) == helper_request
    for reply in HELPER_REPLIES:
        assert helper.decode_reply(encode_msgpack(msgspec.to_builtins(reply))) == reply


def test_the_issue_19_bodies_are_among_the_mutations() -> None:
    """The body of issue 19 (``{"id":1,"op":"\\xc0"}``) is one of the generated inputs."""
    bodies = {m.body for m in json_mutations({"id": 1, "op": "ping"})}
    assert b'{"id":1,"op":"\xc0"}' in bodies
    assert b'{"type":"\xc0"}' in {m.body for m in json_mutations({"type": "hello"})}


def test_control_requests(
    record: Callable[..., None], record_property: Callable[[str, object], None]
) -> None:
    """Mutations of every control request: each decoder returns a message or its error."""
    counts: Counter[str] = Counter()
    for name, request in CONTROL.items():
        _feed(_all_mutations(f"control {name}", request, count=150), counts)
    _report("control", counts, record, record_property, minimum=70_000)


def test_executor_messages(
    record: Callable[..., None], record_property: Callable[[str, object], None]
) -> None:
    """Mutations of every executor message: each decoder returns a message or its error."""
    counts: Counter[str] = Counter()
    for name, message in EXECUTOR.items():
        _feed(_all_mutations(f"executor {name}", message, count=300), counts)
    _report("executor", counts, record, record_property, minimum=16_000)


def test_helper_messages(
    record: Callable[..., None], record_property: Callable[[str, object], None]
) -> None:
    """Mutations of every helper request and reply: each decoder returns a message or its
    error."""
    counts: Counter[str] = Counter()
    for message in (*HELPER_REQUESTS, *HELPER_REPLIES):
        family = f"helper {type(message).__name__}"
        _feed(_all_mutations(family, msgspec.to_builtins(message), count=100), counts)
    _report("helper", counts, record, record_property, minimum=58_000)


# --- over real sockets -------------------------------------------------------------------------

#: Operations that wait (a valid one waits its timeout_s), stop the daemon, or push frames
#: after their answer (a subscription): never sent.
_NOT_SENT: Final = frozenset({"drain", "turn.wait", "executors.wait", "events.subscribe"})
#: The frames of issue 19 (the request body is 17 bytes: header 00 00 00 11).
_ISSUE_19_REQUEST: Final = b'{"id":1,"op":"\xc0"}'
_ISSUE_19_HELLO: Final = b'{"type":"\xc0"}'


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _sample(mutations: Iterable[Mutation], size: int, seed: str) -> list[Mutation]:
    """A seeded uniform sample of ``size`` mutations (reservoir: the rest is never kept)."""
    rng = random.Random(seed)
    kept: list[Mutation] = []
    for index, mutation in enumerate(mutations):
        if index < size:
            kept.append(mutation)
        else:
            slot = rng.randrange(index + 1)
            if slot < size:
                kept[slot] = mutation
    return kept


class _Daemon:
    """A daemon running in a blocking portal's event loop (as in test_fuzz_sockets)."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, config: Config) -> None:
        self.portal = portal
        self.config = config
        self.daemon = Daemon(config, handle_signals=False)
        self.run: Future[int]
        self.run, _ = portal.start_task(self.daemon.run)  # returns once both sockets listen

    def assert_alive(self) -> None:
        """The daemon's run has not ended and it answers ``status``."""

        async def status() -> dict[str, Any]:
            with anyio.fail_after(10):
                async with ControlClient(self.config.control_socket) as client:
                    return await client.call("status")

        assert not self.run.done(), self.run
        assert isinstance(self.portal.call(status), dict)


@pytest.fixture(scope="module")
def daemon() -> Iterator[_Daemon]:
    base = Path(tempfile.mkdtemp(prefix="hh-fuzz-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    config = load_config(None, env={}, overrides={"root": base / "r"})
    try:
        with anyio.from_thread.start_blocking_portal() as portal:
            running = _Daemon(portal, config)
            try:
                yield running
            finally:
                portal.call(running.daemon.request_drain)
                assert running.run.result(timeout=60) == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _read_until_closed(reader: FrameReader) -> list[dict[str, Any]]:
    """Frames until the daemon closes the connection (bounded: a hang fails)."""
    frames: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        while True:
            try:
                frames.append(await reader.read())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return frames


async def _control_exchange(path: Path, body: bytes, *, closes: bool) -> dict[str, Any]:
    """Send one frame on a fresh connection; its answer (and, with ``closes``, check that the
    daemon then closes the connection)."""
    async with await anyio.connect_unix(path) as stream:
        await stream.send(_frame(body))
        reader = FrameReader(stream, max_bytes=1 << 21)
        with anyio.fail_after(10):
            answer = await reader.read()
        if closes:
            assert await _read_until_closed(reader) == [], "more after a bad-frame answer"
        return answer


async def _hello_exchange(path: Path, body: bytes) -> dict[str, Any]:
    """Send ``body`` as a first frame on a fresh connection; the daemon's first answer."""
    async with await anyio.connect_unix(path) as stream:
        await stream.send(_frame(body))
        with anyio.fail_after(10):
            return await FrameReader(stream, max_bytes=1 << 21).read()


async def _after_hello(path: Path, executor_id: str, body: bytes, *, closes: bool) -> None:
    """Greet as ``executor_id``, then send ``body``; with ``closes``, the daemon must close."""
    hello = {**EXECUTOR["hello"], "executor_id": executor_id}
    async with await anyio.connect_unix(path) as stream:
        await stream.send(_frame(encode_json(hello)))
        reader = FrameReader(stream, max_bytes=1 << 21)
        with anyio.fail_after(10):
            welcome = await reader.read()
        assert welcome["type"] == "welcome", welcome
        await stream.send(_frame(body))
        if closes:
            await _read_until_closed(reader)


def _exchange(daemon: _Daemon, mutation: Mutation, run: Callable[[], Awaitable[Any]]) -> Any:
    """``run`` in the daemon's loop; any failure (no answer, a hang) names the mutation."""
    try:
        return daemon.portal.call(run)
    except Exception as exc:
        pytest.fail(f"{exc!r} on {mutation.show()}")


def _control_expectation(body: bytes) -> tuple[str, object, str | None]:
    """What control.sock must answer ``body`` with, from decoding it here: (how it decodes:
    "frame", "request", "valid" or "not sent" for an operation that waits or drains; the
    answer's id; its error code, None when any but ``internal`` will do)."""
    try:
        request = control.decode_request(body)
    except FrameDecodeError:
        return "frame", None, "bad_request"
    except control.RequestDecodeError as exc:
        return "request", exc.request_id, exc.code
    if control.op_of(request) in _NOT_SENT:
        return "not sent", request.id, None
    return "valid", request.id, None


def _check_control_answer(daemon: _Daemon, mutation: Mutation) -> str:
    """Send one mutated request; the answer is the one its decoding calls for (see
    `_control_expectation`); returns how it decoded."""
    path, body = daemon.config.control_socket, mutation.body
    kind, request_id, code = _control_expectation(body)
    if kind == "not sent":
        return kind
    closes = kind == "frame"
    answer = _exchange(daemon, mutation, lambda: _control_exchange(path, body, closes=closes))
    shown = (answer, mutation.show())
    assert answer["id"] == request_id, shown
    if kind == "valid":
        assert answer["ok"] in (True, False), shown
        assert answer["ok"] or answer["error"]["code"] != "internal", shown
    else:
        assert answer["ok"] is False, shown
        assert answer["error"]["code"] == code, shown
    if closes:
        assert answer["error"]["message"].startswith("bad frame: "), shown
    return kind


def _check_hello_answer(daemon: _Daemon, mutation: Mutation) -> str:
    """Send one mutated hello; a reject with the reason its decoding gives, or a welcome."""
    path, body = daemon.config.executor_socket, mutation.body
    answer = _exchange(daemon, mutation, lambda: _hello_exchange(path, body))
    try:
        executor.decode_hello(body)
    except FrameDecodeError:
        expected: str = executor.RejectReason.BAD_MESSAGE
    except ProtocolError as exc:
        expected = exc.reason_code
    else:  # a valid hello: welcome, unless the id is still connected from the previous one
        assert answer["type"] in ("welcome", "reject"), (answer, mutation.show())
        if answer["type"] == "reject":
            assert answer["reason_code"] == "DUPLICATE_EXECUTOR_ID", (answer, mutation.show())
        return "valid"
    assert answer["type"] == "reject", (answer, mutation.show())
    assert answer["reason_code"] == expected, (answer, mutation.show())
    return expected


def _closes_after_hello(body: bytes) -> bool:
    """Whether the hub ends a greeted connection on this frame (a bad frame, an unknown type)."""
    try:
        executor.decode_executor_message(body)
    except FrameDecodeError:
        return True
    except executor.MessageError as exc:
        return exc.message_type not in ("heartbeat", "status")
    return False


def test_issue_19_frames_at_the_sockets(daemon: _Daemon) -> None:
    """The frames of issue 19 get their error answers and the daemon lives on."""
    answer = daemon.portal.call(
        lambda: _control_exchange(daemon.config.control_socket, _ISSUE_19_REQUEST, closes=True)
    )
    assert answer["ok"] is False
    assert answer["error"]["code"] == "bad_request"
    assert "UTF-8" in answer["error"]["message"]
    reject = daemon.portal.call(
        lambda: _hello_exchange(daemon.config.executor_socket, _ISSUE_19_HELLO)
    )
    assert reject["type"] == "reject"
    assert reject["reason_code"] == executor.RejectReason.BAD_MESSAGE
    assert "UTF-8" in reject["reason"]
    daemon.assert_alive()


def _socket_sample(messages: dict[str, dict[str, Any]], size: int, seed: str) -> list[Mutation]:
    """A seeded sample of the mutations of ``messages``: 2/3 structured JSON (what a JSON
    socket reads furthest), 1/6 MessagePack, 1/6 byte-level."""
    kinds: tuple[tuple[Callable[[str, object], Iterable[Mutation]], int], ...] = (
        (lambda _, m: json_mutations(m), size * 2 // 3),
        (lambda _, m: msgpack_mutations(m), size // 6),
        (lambda f, m: byte_mutations(encode_json(m), random.Random(f), count=50), size // 6),
    )
    sample: list[Mutation] = []
    for index, (make, share) in enumerate(kinds):
        every = (m for name, message in messages.items() for m in make(name, message))
        sample.extend(_sample(every, share, f"{seed}:{index}"))
    return sample


def test_structured_frames_at_the_sockets(daemon: _Daemon, record: Callable[..., None]) -> None:
    """A seeded sample of the mutations, each on a fresh connection: control.sock answers each
    as its decoding calls for, executors.sock rejects each bad hello with its reason and closes
    a greeted connection on a bad frame; the daemon still answers ``status`` afterwards."""
    control_sample = _socket_sample(CONTROL, 300, "sockets: control")
    outcomes = Counter(_check_control_answer(daemon, mutation) for mutation in control_sample)
    hellos = _socket_sample({"hello": EXECUTOR["hello"]}, 150, "sockets: hello")
    rejects = Counter(_check_hello_answer(daemon, mutation) for mutation in hellos)
    after_hello = {name: EXECUTOR[name] for name in ("response", "heartbeat", "status")}
    messages = _socket_sample(after_hello, 150, "sockets: after hello")
    path = daemon.config.executor_socket
    closed = 0
    for n, mutation in enumerate(messages):
        closes = _closes_after_hello(mutation.body)
        closed += closes
        greeted = functools.partial(_after_hello, path, f"fuzz-{n}", mutation.body, closes=closes)
        _exchange(daemon, mutation, greeted)
    daemon.assert_alive()
    print(f"control.sock: {dict(outcomes)}; hellos: {dict(rejects)}; closed after hello: {closed}")
    # the sample holds every kind of answer (a sample that drifts to one kind tests less)
    assert min(outcomes["frame"], outcomes["request"], outcomes["valid"]) >= 10, outcomes
    assert min(rejects["BAD_MESSAGE"], rejects["BAD_HELLO"], rejects["valid"]) >= 5, rejects
    assert 20 <= closed <= len(messages) - 20, closed
    sent = sum(outcomes.values()) - outcomes["not sent"]
    record("structured: control.sock frames", sent, minimum=250)
    record("structured: executors.sock hellos", len(hellos), minimum=150)
    record("structured: executors.sock after hello", len(messages), minimum=150)
