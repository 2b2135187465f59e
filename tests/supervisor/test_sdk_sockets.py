"""An executor pointed at the wrong socket (issue 21): what the user sees.

A real in-process daemon and real SDK executors: in this process (`run_executor`) and as the
example executor's command line in a subprocess, reading its log lines on stderr. Pointed at the
daemon's ``control.sock`` the SDK stops at once with `WrongSocket`, naming both sockets, instead
of retrying for ever on ``expected a 'welcome' message, got type None``. Pointed at a socket
that is not there (the daemon not started yet), it keeps retrying and says so at warning, with
the path and the retry interval, once for the outage rather than per retry; once the daemon
listens there, it connects."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.config import load_config
from supervisor.config.schema import Config
from supervisor.control.client import ControlClient
from supervisor.examples._cli import EXIT_REJECTED
from supervisor.sdk import Backoff, Executor, ExecutorRejected, WrongSocket, run_executor
from supervisor.server import Daemon
from tests.live_daemon import WAIT_S, demo_root

#: A retry would wait an hour: a test that retries runs into its WAIT_S bound and fails.
NEVER_AGAIN = Backoff(initial_s=3600.0, max_s=3600.0, jitter=0.0)


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package installed; removed afterwards."""
    yield from demo_root("hh-sock-")


def config_of(root: Path) -> Config:
    return load_config(None, env={}, overrides={"root": root})


@asynccontextmanager
async def daemon_serving(config: Config) -> AsyncIterator[Daemon]:
    """The daemon of *config*, ready (both sockets listening); drained afterwards."""
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_drain()


def example_executor(socket: Path, executor_id: str, *extra: str) -> list[str]:
    """The command line of the example web executor (what a user starts first)."""
    module = "supervisor.examples.web_executor"
    return [sys.executable, "-m", module, "--socket", str(socket), "--id", executor_id, *extra]


class LogLines:
    """The JSON log lines a process writes on stderr, as they come."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.other: list[str] = []
        self._more = anyio.Event()

    async def pump(self, stream: anyio.abc.ByteReceiveStream) -> None:
        buffered = BufferedByteReceiveStream(stream)
        while True:
            try:
                line = await buffered.receive_until(b"\n", 1 << 20)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                break
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.other.append(line.decode(errors="replace"))
            self._more.set()
            self._more = anyio.Event()
        self._more.set()

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait until *done()* holds (it is checked after each line)."""
        while not done():
            await self._more.wait()


async def test_executor_at_the_control_socket_stops_at_once_naming_both_sockets(
    root: Path,
) -> None:
    """`run_executor` pointed at control.sock raises `WrongSocket` on its first connection
    (reconnect on, and a retry would wait an hour): the message says this is the control
    socket, not executors.sock, and names the executor socket beside it. The daemon's control
    API is unharmed."""
    config = config_of(root)
    async with daemon_serving(config):
        with anyio.fail_after(WAIT_S), pytest.raises(WrongSocket) as caught:
            await run_executor(
                Executor(executor_id="misdirected"),
                socket_path=config.control_socket,
                backoff=NEVER_AGAIN,
            )
        async with ControlClient(config.control_socket) as client:
            assert (await client.call("ping"))["pong"] is True
    error = caught.value
    assert isinstance(error, ExecutorRejected)  # what callers already catch
    assert error.reason_code == "wrong_socket"
    assert error.socket_path == str(config.control_socket)
    message = str(error)
    assert f"{config.control_socket} is the hunter daemon's control socket" in message
    assert "not its executor socket (executors.sock)" in message
    assert f"({config.executor_socket}, beside it)" in message
    assert "expected a 'welcome' message" not in message


async def test_example_executor_at_the_control_socket_exits_with_the_message(root: Path) -> None:
    """The example executor's command line, pointed at control.sock with reconnection on, exits
    with its 'rejected' code and the message on stderr instead of looping."""
    config = config_of(root)
    async with daemon_serving(config):
        with anyio.fail_after(WAIT_S):
            done = await anyio.run_process(
                example_executor(config.control_socket, "misdirected"), check=False
            )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_REJECTED, stderr
    assert "rejected by the daemon: wrong_socket: " in stderr
    assert f"{config.control_socket} is the hunter daemon's control socket" in stderr
    assert str(config.executor_socket) in stderr


async def test_executor_started_before_the_daemon_warns_once_then_connects(root: Path) -> None:
    """An executor whose socket is not there yet logs `daemon_unreachable` at warning with the
    path and the retry interval, keeps retrying (one debug `connect_failed` per retry, no
    further warning) and connects once the daemon listens there."""
    config = config_of(root)
    socket = config.executor_socket
    assert not socket.exists()
    logs = LogLines()
    command = example_executor(socket, "early-bird", "--log-level", "debug")
    async with (
        await anyio.open_process(command, stdout=subprocess.DEVNULL) as process,
        anyio.create_task_group() as tg,
    ):
        assert process.stderr is not None
        tg.start_soon(logs.pump, process.stderr)
        try:
            with anyio.fail_after(WAIT_S):
                # The outage: a few retries, each at debug.
                await logs.until(lambda: len(logs.named("connect_failed")) >= 3)
                async with daemon_serving(config), ControlClient(config.control_socket) as client:
                    await client.call("executors.wait", executor_id="early-bird", timeout_s=WAIT_S)
                    await logs.until(lambda: bool(logs.named("daemon_reachable")))
        finally:
            process.terminate()
        with anyio.fail_after(WAIT_S):
            assert await process.wait() == 0, logs.other
    (warning,) = logs.named("daemon_unreachable")  # one for the outage, not one per retry
    assert warning["level"] == "warning"
    assert warning["socket"] == str(socket)
    assert warning["error"].startswith("FileNotFoundError")
    assert warning["retry_in_s"] > 0
    assert warning["retry_max_s"] == Backoff().max_s
    assert "still retrying" in warning["hint"]
    retries = logs.named("connect_failed")
    assert len(retries) >= 3
    assert all(r["level"] == "debug" and r["socket"] == str(socket) for r in retries)
    assert logs.named("connected")
