"""The order of the daemon's last log lines (issue 21): a real `hunter serve` process with a
connected SDK executor is stopped with SIGTERM, and its JSON log is read as an operator reads
it. Every executor's `executor_disconnected` (reason `HUB_CLOSED`: the daemon closed it) comes
before `daemon_stopped`; nothing of the daemon's is logged after `daemon_stopped` about an
executor."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root

pytestmark = pytest.mark.slow


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root other users can traverse, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hh-stop-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _events(log: Path) -> list[dict[str, Any]]:
    """The daemon's JSON log lines, in order (anything else, e.g. a traceback, is skipped)."""
    events = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


async def test_executors_disconnect_before_daemon_stopped(root: Path) -> None:
    """SIGTERM with two SDK executors connected (one ran a turn): the log ends with the
    drain, both `executor_disconnected` (HUB_CLOSED), then `daemon_stopped`."""
    config = prepare_root(root, fresh=True, config_text=DEMO_CONFIG)
    stack = DemoStack(root=root, config_path=config)
    try:
        await stack.start_daemon()
        for executor_id in ("sdk-1", "sdk-2"):
            await stack.start_executor(
                executor_id,
                ["supervisor.examples.chaos_executor", "--commands", "READ", "--no-reconnect"],
            )
        async with ControlClient(stack.control_socket) as client:
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            done = await client.call(
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector="h1",
                declared_outputs=[],
                wait_s=30,
            )
        assert done["turn"]["state"] == "succeeded"
        assert await stack.stop_daemon(signal.SIGTERM) == 0
    finally:
        await stack.aclose()
    events = _events(stack.daemon_log)
    names = [e["event"] for e in events]
    assert "daemon_stopped" in names, names[-10:]
    stopped = names.index("daemon_stopped")
    gone = [e for e in events if e["event"] == "executor_disconnected"]
    assert sorted(e["executor_id"] for e in gone) == ["sdk-1", "sdk-2"]
    assert {e["reason_code"] for e in gone} == {"HUB_CLOSED"}
    assert {e["detail"] for e in gone} == {"the hub is shutting down"}
    drained = names.index("drain_finished")
    assert names.index("shutdown_requested") < drained < stopped, names
    assert names[drained:stopped].count("executor_disconnected") == 2, names[drained:]
    assert "executor_disconnected" not in names[stopped + 1 :], names[stopped:]
