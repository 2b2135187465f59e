"""Shared harness of the executor hub tests: a hub on a real Unix socket, chaos executors.

Executors are SDK-based processes (``python -m supervisor.examples.chaos_executor``) spawned
with ``anyio.open_process``; a few protocol cases use a raw socket client to send exactly the
bytes under test. The ``socket_dir`` fixture is in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import pytest

from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import build_executor_instruction
from supervisor.executors.hub import AttemptReport, ExecutorHub, HubSettings, open_executor_listener
from supervisor.wire.executor import PROTOCOL_VERSION
from supervisor.wire.frames import FrameReader, encode_frame

SPAWN_TIMEOUT_S = 20.0


class RecordingLog:
    """A structlog-shaped logger that records events and lets tests wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self._changed = anyio.Event()

    def _record(self, level: str, event: str, **kw: Any) -> None:
        self.events.append((level, event, kw))
        self._changed.set()
        self._changed = anyio.Event()

    def debug(self, event: str, **kw: Any) -> None:
        self._record("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._record("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._record("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def find(self, event: str, **match: object) -> list[dict[str, Any]]:
        return [
            kw
            for _, name, kw in self.events
            if name == event and all(kw.get(k) == v for k, v in match.items())
        ]

    async def wait_for(self, event: str, **match: object) -> dict[str, Any]:
        with anyio.fail_after(SPAWN_TIMEOUT_S):
            while not (found := self.find(event, **match)):
                await self._changed.wait()
        return found[0]


@dataclass
class Harness:
    hub: ExecutorHub
    log: RecordingLog
    socket: Path
    tg: anyio.abc.TaskGroup
    processes: list[anyio.abc.Process] = field(default_factory=list)
    stderr: list[IO[bytes]] = field(default_factory=list)

    async def spawn(
        self,
        executor_id: str,
        *behaviours: str,
        slots: int = 1,
        commands: str | None = None,
        extra: tuple[str, ...] = (),
        user: int | None = None,
        wait: bool = True,
    ) -> anyio.abc.Process:
        """Start a chaos executor process and (by default) wait until it is READY."""
        argv = [
            sys.executable,
            "-m",
            "supervisor.examples.chaos_executor",
            "--socket",
            str(self.socket),
            "--id",
            executor_id,
            "--slots",
            str(slots),
            *(arg for b in behaviours for arg in ("--behaviour", b)),
            *extra,
        ]
        if commands is not None:
            argv += ["--commands", commands]
        err = (self.socket.parent / f"{executor_id}.stderr").open("wb")
        self.stderr.append(err)
        if user is not None:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("setpriv (util-linux) is needed to run as another uid")
            argv = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        process = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
        self.processes.append(process)
        if wait:
            with anyio.fail_after(SPAWN_TIMEOUT_S):
                await self.hub.wait_for_executor(executor_id)
        return process

    async def stop_processes(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
            await process.wait()
            await process.aclose()
        for err in self.stderr:
            err.close()


def hub_settings(**changes: Any) -> HubSettings:
    base: dict[str, Any] = {
        "heartbeat_interval_s": 5.0,
        "heartbeat_misses": 3,
        "queue_wait_s": 10.0,
        "quarantine_s": 300.0,
        "cancel_grace_s": 2.0,
        "hello_timeout_s": 5.0,
    }
    base.update(changes)
    return HubSettings(**base)


@asynccontextmanager
async def running_hub(
    socket_dir: Path, *, mode: int = 0o660, **changes: Any
) -> AsyncIterator[Harness]:
    """A hub serving on socket_dir/ex.sock inside a task group; everything stopped on exit."""
    log = RecordingLog()
    hub = ExecutorHub(settings=hub_settings(**changes), log=log)
    path = socket_dir / "ex.sock"
    listener = await open_executor_listener(path, mode=mode)
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        harness = Harness(hub=hub, log=log, socket=path, tg=tg)
        try:
            yield harness
        finally:
            with anyio.CancelScope(shield=True):
                await hub.aclose()
                await harness.stop_processes()
                await listener.aclose()
            tg.cancel_scope.cancel()


_counter = iter(range(1, 1_000_000))


def instruction(
    command: str = "READ", *, timeout_ms: int = 5000, instruction_id: str | None = None
) -> ExecutorInstructionEnvelope:
    n = next(_counter)
    kwargs: dict[str, Any] = {}
    if command == "NAVIGATE":
        kwargs["target_url"] = "http://127.0.0.1:9/"
    elif command in {"READ", "CLICK", "EXTRACT"}:
        kwargs["target_selector"] = "#title"
    return build_executor_instruction(
        instruction_id=instruction_id or f"ins-{n}",
        execution_id=f"exe-{n}",
        command_type=command,
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=timeout_ms,
        **kwargs,
    )


def fault_type_of(report: AttemptReport) -> ExecutionFaultType | None:
    return report.outcome.fault_type


async def raw_client(path: Path) -> tuple[anyio.abc.SocketStream, FrameReader]:
    stream = await anyio.connect_unix(path)
    return stream, FrameReader(stream)


def hello_frame(executor_id: str, **changes: object) -> dict[str, object]:
    hello: dict[str, object] = {
        "type": "hello",
        "executor_id": executor_id,
        "protocol_version": PROTOCOL_VERSION,
        "commands": ["READ"],
        "slots": 1,
    }
    hello.update(changes)
    return hello


async def hello_answer(path: Path, hello: Mapping[str, object]) -> dict[str, Any]:
    stream, reader = await raw_client(path)
    async with stream:
        await stream.send(encode_frame(hello))
        with anyio.fail_after(5):
            return await reader.read()
