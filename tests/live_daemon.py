"""A real in-process daemon for tests that drive it end to end: a fresh root with the demo
package, the daemon serving it, an SDK executor connected and a demo session open."""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from supervisor.config import load_config
from supervisor.control.client import ControlClient
from supervisor.demo.stack import prepare_root
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.server import Daemon

#: The bound of every wait of these tests; a healthy run takes well under a second each.
WAIT_S = 20.0


def demo_root(prefix: str) -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed (a fixture's body:
    removed when the generator closes)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def serving(
    root: Path, executor: Executor, **overrides: object
) -> AsyncIterator[tuple[ControlClient, str]]:
    """An in-process daemon serving *root* with *executor* connected and a session of the demo
    package open: the client and the session id (executor stopped, daemon drained after)."""
    config = load_config(None, env={}, overrides={"root": root, **overrides})
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            async with anyio.create_task_group() as executors:
                executors.start_soon(
                    functools.partial(
                        run_executor, executor, socket_path=config.executor_socket, reconnect=False
                    )
                )
                try:
                    async with ControlClient(config.control_socket) as client:
                        await client.call(
                            "executors.wait", executor_id=executor.executor_id, timeout_s=WAIT_S
                        )
                        opened = await client.call("session.open", package_id="demo")
                        yield client, str(opened["session_id"])
                finally:
                    executors.cancel_scope.cancel()
        finally:
            daemon.request_drain()


class Gated(Executor):
    """READ waits for ``gate``; ``all_started`` is set once *expected* handlers are waiting."""

    def __init__(self, *, slots: int, expected: int) -> None:
        super().__init__(executor_id="gated", slots=slots)
        self.expected = expected
        self.started = 0
        self.all_started = anyio.Event()
        self.gate = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()
        await self.gate.wait()
        return Result.success("page")


class Sleeper(Executor):
    """READ never answers: it sleeps until the daemon's cancel cancels it."""

    def __init__(self) -> None:
        super().__init__(executor_id="sleeper")
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover
