"""systemd STATUS= carries live counts (turns active, queued, executors ready): a real daemon,
a real executor process and a real notify socket standing in for systemd's."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor.config import load_config
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root
from supervisor.server import Daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound where $NOTIFY_SOCKET points, as systemd's would be."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


async def _status_until(sock: socket.socket, expected: str) -> str:
    """The first STATUS= line received that contains *expected* (earlier ones are skipped)."""
    seen: list[str] = []
    with anyio.move_on_after(20):
        while True:
            await anyio.wait_readable(sock)
            for line in sock.recv(4096).decode().splitlines():
                if line.startswith("STATUS="):
                    seen.append(line)
                    if expected in line:
                        return line
    raise AssertionError(f"no STATUS= with {expected!r}; received {seen}")


async def test_status_line_follows_turns_and_executors(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """STATUS= says how many turns are active and queued and how many executors are ready,
    and changes as an executor connects and a turn waits for a command nobody serves."""
    root = tmp_path / "r"
    config_path = prepare_root(root, fresh=True)
    config = load_config(
        config_path,
        env={},
        overrides={"root": root, "metrics.status_interval_s": 0.1, "executors.queue_wait_s": 60},
    )
    daemon = Daemon(config, handle_signals=False)
    stack = DemoStack(root=root, config_path=config_path)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            first = await _status_until(notify_socket, "turns active")
            assert first == (
                "STATUS=0 turns active, 0 queued, 0 attempts running; 0 executors ready, 0 busy"
            )
            await stack.start_executor(
                "reader",
                [
                    "supervisor.examples.chaos_executor",
                    "--commands",
                    "READ",
                    "--behaviour",
                    "ok",
                    "--no-reconnect",
                ],
            )
            await _status_until(notify_socket, "1 executors ready")
            async with ControlClient(config.control_socket) as client:
                opened = await client.call("session.open", package_id="demo")
                submitted = await client.call(
                    "turn.submit",
                    session_id=opened["session_id"],
                    kind="instruction",
                    command_type="SCROLL",
                    timeout_ms=60_000,
                    declared_outputs=[],
                )
                turn_id = submitted["turn"]["turn_id"]
                queued = await _status_until(notify_socket, "1 turns active, 1 queued")
                assert queued.endswith("1 executors ready, 0 busy")
                await client.call("turn.cancel", turn_id=turn_id)
                await _status_until(notify_socket, "0 turns active, 0 queued")
        finally:
            await stack.aclose()
            daemon.request_drain()
