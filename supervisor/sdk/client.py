"""The SDK's connection to the daemon: hello, heartbeats, handlers, cancellation, reconnection.

``run_executor(executor, socket_path=...)`` runs until the executor handles SHUTDOWN, the daemon
rejects it for good (``ExecutorRejected``; ``WrongSocket`` when ``socket_path`` is the daemon's
``control.sock``), ``reconnect=False`` and the connection ends, or the caller cancels it. Each
connection (``connection.Connection``) runs one task group: a reader, the frame writer, a
heartbeat/watchdog task and at most ``executor.slots`` workers that run the handlers
(``slots.Slots``), each instruction in its own cancel scope, cancelled by ``cancel``.

While the socket cannot be reached (no file, nobody listening: the daemon is not running yet,
or the path is wrong) the SDK keeps retrying and says so at warning (``daemon_unreachable``,
with the path and the retry interval) once when the outage starts and again every
``_UNREACHABLE_REPEAT_S`` while it lasts; each single retry is ``connect_failed`` at debug.
"""

from __future__ import annotations

import os
import time
from typing import Final

import anyio
import structlog

from supervisor.errors import ExecutorRejected
from supervisor.sdk.backoff import Backoff
from supervisor.sdk.connection import Connection
from supervisor.sdk.errors import WrongSocket
from supervisor.sdk.executor import Executor
from supervisor.wire.executor import ProtocolError, RejectReason
from supervisor.wire.frames import FrameError

__all__ = ["Connection", "ExecutorRejected", "WrongSocket", "run_executor"]

_log = structlog.get_logger("supervisor.sdk")
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


def _describe(exc: OSError) -> str:
    """``FileNotFoundError: No such file or directory`` (the path is logged beside it)."""
    return f"{type(exc).__name__}: {exc.strerror or exc}"


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
