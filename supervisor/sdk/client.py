"""The SDK's connection to the daemon: hello, heartbeats, handlers, cancellation, reconnection.

``run_executor(executor, socket_path=...)`` runs until the executor handles SHUTDOWN, the daemon
rejects it for good (``ExecutorRejected``; ``WrongSocket`` when ``socket_path`` is the daemon's
``control.sock``), ``reconnect=False`` and the connection ends, or the caller cancels it. Each
connection runs one task group: a reader, a heartbeat/watchdog task and one task per running
instruction (each in its own cancel scope, cancelled by ``cancel``).

While the socket cannot be reached (no file, nobody listening: the daemon is not running yet,
or the path is wrong) the SDK keeps retrying and says so at warning (``daemon_unreachable``,
with the path and the retry interval) once when the outage starts and again every
``_UNREACHABLE_REPEAT_S`` while it lasts; each single retry is ``connect_failed`` at debug.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import anyio.abc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.errors import ExecutorRejected
from supervisor.sdk.backoff import Backoff
from supervisor.sdk.executor import Executor, Instruction, NotSupported, Result
from supervisor.sdk.tracing import executor_span
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Heartbeat,
    Hello,
    MessageType,
    ProtocolError,
    RejectReason,
    Status,
    Welcome,
    parse_cancel,
    parse_instruction,
    parse_reject,
    parse_welcome,
    response_message,
)
from supervisor.wire.frames import HEADER_SIZE, FrameError, FrameReader, FrameWriter, encode_frame

__all__ = ["Connection", "ExecutorRejected", "WrongSocket", "run_executor"]

_log = structlog.get_logger("supervisor.sdk")
_Work = tuple[Instruction, anyio.CancelScope]
_HANDSHAKE_TIMEOUT_S: Final = 10.0
_RETRYABLE_REJECTS: Final = frozenset(
    {
        RejectReason.QUARANTINED,
        RejectReason.DUPLICATE_EXECUTOR_ID,
        RejectReason.HUB_CLOSING,
        RejectReason.HELLO_TIMEOUT,
    }
)
#: While the socket stays unreachable, ``daemon_unreachable`` is repeated this often (seconds).
_UNREACHABLE_REPEAT_S: Final = 60.0


class WrongSocket(ExecutorRejected):
    """Raised by ``run_executor`` when ``socket_path`` is the daemon's control socket
    (``control.sock``, the API of ``hunter`` commands and clients) rather than its executor
    socket (``executors.sock``): the control API answered the ``hello`` with an error of its
    own. Never retried: no reconnect can fix the path. ``socket_path`` is the socket tried."""

    def __init__(self, socket_path: str, answer: Mapping[str, Any]) -> None:
        self.socket_path = socket_path
        error = answer.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        beside = os.path.join(os.path.dirname(socket_path), "executors.sock")
        where = (
            f"{beside}, beside it"
            if socket_path and os.path.exists(beside)
            else "<root>/run/executors.sock by default; the daemon's daemon_ready line names it"
        )
        super().__init__(
            "wrong_socket",
            f"{socket_path or 'the socket'} is the hunter daemon's control socket (control.sock),"
            f" not its executor socket (executors.sock): it answered hello with a control-API"
            f" error ({code or 'no code'}). Point the executor at executors.sock ({where}).",
        )


def _is_control_answer(frame: Mapping[str, Any]) -> bool:
    """Whether *frame* is an answer of the control API (``{"id", "ok", ...}``, no ``type``)."""
    return "type" not in frame and isinstance(frame.get("ok"), bool)


def _describe(exc: OSError) -> str:
    """``FileNotFoundError: No such file or directory`` (the path is logged beside it)."""
    return f"{type(exc).__name__}: {exc.strerror or exc}"


class Connection:
    """One live connection to the daemon (``executor.connection`` while connected)."""

    def __init__(
        self,
        executor: Executor,
        stream: anyio.abc.SocketStream,
        *,
        max_frame_bytes: int,
        socket_path: str = "",
    ) -> None:
        self.executor = executor
        self.stream = stream
        #: the path connected to, as given (for messages; the peer's address otherwise)
        self.socket_path = socket_path
        self.reader = FrameReader(stream, max_bytes=max_frame_bytes)
        self.welcome: Welcome | None = None
        self._writer = FrameWriter(stream)
        self._scopes: dict[str, anyio.CancelScope] = {}
        #: the daemon's traceparent per instruction, until its handler runs
        self._traceparents: dict[str, str] = {}
        self._last_rx = time.monotonic()
        self._tg: anyio.abc.TaskGroup | None = None
        self._work: MemoryObjectSendStream[_Work] | None = None
        self.closed_reason = ""

    async def send_message(self, message: Mapping[str, object]) -> None:
        """Send one protocol message as a frame."""
        await self.send_raw(encode_frame(message))

    async def send_raw(self, data: bytes, *, cork: bool | None = None) -> None:
        """Send raw bytes (test executors use it to send broken frames)."""
        await self._writer.send(data, cork=cork)

    async def send_status(self, status: Status) -> None:
        """Tell the daemon whether this executor takes new work."""
        await self.send_message(status.to_wire())

    @property
    def running(self) -> frozenset[str]:
        """Ids of the instructions whose handlers are running."""
        return frozenset(self._scopes)

    async def handshake(self) -> Welcome:
        """Send hello, wait for welcome; raises ``ExecutorRejected`` on a reject and
        ``WrongSocket`` when the control API answered."""
        executor = self.executor
        hello = Hello(
            executor_id=executor.executor_id,
            protocol_version=PROTOCOL_VERSION,
            commands=executor.commands(),
            slots=executor.slots,
            software=executor.software,
        )
        await self.send_message(hello.to_wire())
        with anyio.fail_after(_HANDSHAKE_TIMEOUT_S):
            frame = await self.reader.read()
        if frame.get("type") == MessageType.REJECT:
            reject = parse_reject(frame)
            raise ExecutorRejected(reject.reason_code, reject.reason, reject.retry_after_ms)
        if _is_control_answer(frame):
            path = self.socket_path or self.stream.extra(
                anyio.abc.SocketAttribute.remote_address, ""
            )
            raise WrongSocket(path if isinstance(path, str) else "", frame)
        welcome = parse_welcome(frame)
        self.reader.max_bytes = max(self.reader.max_bytes, welcome.max_frame_bytes)
        self.welcome = welcome
        return welcome

    async def serve(self) -> str:
        """Run the connection until it ends; returns why it ended."""
        welcome = self.welcome
        if welcome is None:
            raise RuntimeError("handshake() first")
        send, receive = anyio.create_memory_object_stream[_Work](math.inf)
        self._work = send
        async with send, receive, anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._writer.run)
            tg.start_soon(self._heartbeats, welcome)
            # One long-lived worker per slot: cheaper than a task per instruction.
            for _ in range(self.executor.slots):
                tg.start_soon(self._worker, receive)
            self.closed_reason = await self._read_loop()
            tg.cancel_scope.cancel()
        return self.closed_reason

    async def _worker(self, receive: MemoryObjectReceiveStream[_Work]) -> None:
        async for instruction, scope in receive:
            await self._run(instruction, scope)

    def _close(self) -> None:
        """End this connection: cancel its tasks; run_executor then closes the socket."""
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _heartbeats(self, welcome: Welcome) -> None:
        interval = welcome.heartbeat_interval_ms / 1000
        limit = interval * welcome.heartbeat_misses
        while True:
            await anyio.sleep(interval)
            silent = time.monotonic() - self._last_rx
            if silent > limit:
                self.closed_reason = f"no frame from the daemon for {silent:.1f}s"
                _log.warning("daemon_silent", executor_id=self.executor.executor_id)
                self._close()
                return
            try:
                with anyio.move_on_after(limit):
                    await self.send_message(Heartbeat(ts_us=time.time_ns() // 1000).to_wire())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the reader sees the end of the connection

    async def _read_loop(self) -> str:
        tg = self._tg
        if tg is None:  # pragma: no cover - serve() sets it
            raise RuntimeError("no task group")
        try:
            while True:
                frame = await self.reader.read()
                self._last_rx = time.monotonic()
                kind = frame.get("type")
                if kind == MessageType.INSTRUCTION:
                    self._start_instruction(tg, frame)
                elif kind == MessageType.CANCEL:
                    cancel = parse_cancel(frame)
                    scope = self._scopes.get(cancel.instruction_id)
                    if scope is not None:
                        scope.cancel()
                elif kind == MessageType.REJECT:
                    reject = parse_reject(frame)
                    return f"rejected: {reject.reason_code}: {reject.reason}"
                # heartbeat and unknown (future) messages: liveness only
        except anyio.EndOfStream:
            return self.closed_reason or "the daemon closed the connection"
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            return self.closed_reason or f"connection lost: {exc!r}"
        except (FrameError, ProtocolError) as exc:
            return f"protocol error from the daemon: {exc}"

    def _start_instruction(self, tg: anyio.abc.TaskGroup, frame: Mapping[str, Any]) -> None:
        try:
            instruction = parse_instruction(frame)
        except ProtocolError as exc:
            body = frame.get("instruction")
            iid = body.get("instruction_id") if isinstance(body, dict) else None
            _log.warning("instruction_invalid", reason=exc.reason)
            if isinstance(iid, str) and iid:
                tg.start_soon(self._answer, iid, Result.refused(f"invalid instruction: {exc}"))
            return
        # The scope exists from now on, so a cancel that arrives before a worker picks the
        # instruction up still cancels it (the worker then answers TIMEOUT at once).
        scope = anyio.CancelScope()
        self._scopes[instruction.instruction_id] = scope
        traceparent = frame.get("traceparent")
        if isinstance(traceparent, str):  # the daemon's trace of this attempt (tracing.py)
            self._traceparents[instruction.instruction_id] = traceparent
        if self._work is None:  # pragma: no cover - serve() sets it before reading
            raise RuntimeError("no work queue")
        self._work.send_nowait((instruction, scope))

    async def _run(self, instruction: Instruction, scope: anyio.CancelScope) -> None:
        iid = instruction.instruction_id
        result: Result | Mapping[str, Any] | None = None
        traceparent = self._traceparents.pop(iid, None)
        span = executor_span(
            traceparent,
            f"hunter.executor.{instruction.command_type.value.lower()}",
            {"hunter.instruction_id": iid, "hunter.executor_id": self.executor.executor_id},
        )
        try:
            with scope, span:
                try:
                    result = await self.executor.handle(instruction)
                except NotSupported as exc:
                    result = Result.refused(exc.reason)
                except Exception as exc:  # a handler bug is an ERROR answer, not a dead executor
                    _log.exception("handler_failed", instruction_id=iid)
                    result = Result.error(f"{type(exc).__name__}: {exc}")
            if scope.cancelled_caught or result is None:
                result = Result.timeout("cancelled by the daemon")
        finally:
            self._scopes.pop(iid, None)
        await self._answer(iid, result)
        if self.executor.stop_requested:
            with anyio.move_on_after(_HANDSHAKE_TIMEOUT_S):
                await self._writer.flush()
            self.closed_reason = "shutdown requested"
            self._close()

    async def _answer(self, iid: str, result: Result | Mapping[str, Any]) -> None:
        body = result.to_wire(iid) if isinstance(result, Result) else dict(result)
        evidence = result.evidence if isinstance(result, Result) else None
        frame = encode_frame(response_message(body, evidence=evidence))
        limit = self.welcome.max_frame_bytes if self.welcome is not None else None
        if limit is not None and evidence is not None and len(frame) - HEADER_SIZE > limit:
            # The daemon's frames are smaller than the evidence: send its hash alone.
            _log.warning(
                "response_too_large", instruction_id=iid, size=len(frame), limit=limit,
                evidence_dropped=True,
            )  # fmt: skip
            frame = encode_frame(response_message(body))
        if limit is not None and len(frame) - HEADER_SIZE > limit:
            # The daemon would refuse the frame and drop the connection: say so instead.
            _log.warning("response_too_large", instruction_id=iid, size=len(frame), limit=limit)
            message = f"the response of {len(frame)} bytes exceeds max_frame_bytes={limit}"
            frame = encode_frame(response_message(Result.failure(message).to_wire(iid)))
        try:
            # Other instructions still running: their answers follow soon, batch them.
            await self.send_raw(frame, cork=bool(self._scopes))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            _log.info("response_undeliverable", instruction_id=iid)

    async def flush(self) -> None:
        """Wait until every message sent so far has been handed to the kernel."""
        await self._writer.flush()


async def run_executor(
    executor: Executor,
    *,
    socket_path: str | os.PathLike[str],
    reconnect: bool = True,
    backoff: Backoff | None = None,
    max_frame_bytes: int = 1_048_576,
) -> None:
    """Connect ``executor`` to the daemon at ``socket_path`` and serve it (see module docs).

    Reconnects with ``backoff`` after a lost connection, a failed connect or a retryable reject
    (quarantine: waits at least the daemon's ``retry_after_ms``). Raises ``ExecutorRejected`` for
    a permanent reject (``WrongSocket``, at once, for the daemon's control socket), and
    ``OSError`` when the first connect fails and ``reconnect`` is off.
    """
    policy = backoff if backoff is not None else Backoff()
    path = os.fspath(socket_path)
    failures = 0
    unreachable_since: float | None = None  # when the current outage began (monotonic)
    warned_at = 0.0
    log = _log.bind(executor_id=executor.executor_id)
    executor.stop_requested = False
    while True:
        delay = policy.delay(failures)
        try:
            stream = await anyio.connect_unix(path)
        except OSError as exc:
            if not reconnect:
                raise
            now = time.monotonic()
            if unreachable_since is None or now - warned_at >= _UNREACHABLE_REPEAT_S:
                # Once per outage (and then every _UNREACHABLE_REPEAT_S), not per retry.
                unreachable_since = unreachable_since if unreachable_since is not None else now
                warned_at = now
                log.warning(
                    "daemon_unreachable",
                    socket=path,
                    error=_describe(exc),
                    retry_in_s=round(delay, 3),
                    retry_max_s=policy.max_s,
                    unreachable_s=round(now - unreachable_since, 1),
                    hint="still retrying: is the daemon running, and is this its executors.sock?",
                )
            log.debug("connect_failed", socket=path, error=repr(exc), retry_in_s=round(delay, 3))
            failures += 1
            await anyio.sleep(delay)
            continue
        if unreachable_since is not None:
            log.info(
                "daemon_reachable",
                socket=path,
                unreachable_s=round(time.monotonic() - unreachable_since, 1),
            )
            unreachable_since = None
        async with stream:
            conn = Connection(executor, stream, max_frame_bytes=max_frame_bytes, socket_path=path)
            try:
                welcome = await conn.handshake()
            except ExecutorRejected as exc:
                log.warning("executor_rejected", reason_code=exc.reason_code, reason=exc.reason)
                if not reconnect or exc.reason_code not in _RETRYABLE_REJECTS:
                    raise
                delay = max(delay, (exc.retry_after_ms or 0) / 1000)
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                OSError,
                FrameError,
                ProtocolError,
            ) as exc:
                if not reconnect:
                    raise
                log.info("handshake_failed", error=repr(exc))
            else:
                failures = 0
                executor.connection = conn
                log.info("connected", socket=path, slots=executor.slots)
                await executor.on_connected(welcome)
                try:
                    reason = await conn.serve()
                finally:
                    executor.connection = None
                log.info("disconnected", reason=reason)
                await executor.on_disconnected(reason)
        if executor.stop_requested or not reconnect:
            return
        await anyio.sleep(delay)
        failures += 1
