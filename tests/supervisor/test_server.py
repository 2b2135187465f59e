"""`hunter serve` in-process and as a subprocess: readiness, sockets, lock, signals, reload,
socket activation, drain."""

from __future__ import annotations

import gc
import io
import os
import signal
import socket
import stat
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from supervisor.config import Config, load_config
from supervisor.control.client import ControlClient, socket_for_root
from supervisor.heap import THRESHOLD
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon, DaemonAlreadyRunning


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """JSON log lines captured in memory; logging is reset afterwards."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream)
    try:
        yield stream
    finally:
        reset_logging()


def _events(stream: io.StringIO) -> list[str]:
    return [orjson.loads(line)["event"] for line in stream.getvalue().splitlines() if line]


def _config(root: Path, **overrides: object) -> Config:
    return load_config(None, env={}, overrides={"root": root, **overrides})


@asynccontextmanager
async def running(daemon: Daemon) -> AsyncIterator[list[int]]:
    """Run *daemon* in a task group until the block ends, then drain it; yields [exit code]."""
    codes: list[int] = []
    async with anyio.create_task_group() as tg:

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            codes.append(await daemon.run(task_status=task_status))

        await tg.start(run)
        try:
            yield codes
        finally:
            daemon.request_drain()


async def test_ready_when_both_sockets_listen(tmp_path: Path, log_stream: io.StringIO) -> None:
    """After start-up both sockets exist with mode 0660 and the control API answers."""
    config = _config(tmp_path / "root")
    daemon = Daemon(config, handle_signals=False)
    async with running(daemon) as codes:
        for path in (config.control_socket, config.executor_socket):
            mode = path.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o660
        async with ControlClient(config.control_socket) as client:
            pong = await client.call("ping")
        assert pong["pid"] == os.getpid()
    assert codes == [0]
    assert not config.control_socket.exists()
    events = _events(log_stream)
    assert events.index("daemon_ready") < events.index("drain_started")
    # a daemon inside another program leaves that program's collector as it found it
    assert gc.get_threshold() != THRESHOLD
    assert gc.get_freeze_count() == 0
    assert "daemon_stopped" in events


async def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    """A socket file left by a dead daemon is unlinked and re-created."""
    config = _config(tmp_path / "root")
    config.runtime_dir.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(config.control_socket))
    stale.close()
    async with (
        running(Daemon(config, handle_signals=False)),
        ControlClient(config.control_socket) as client,
    ):
        await client.call("ping")


async def test_second_daemon_is_refused(tmp_path: Path) -> None:
    """A second daemon on the same root is refused with the first one's pid."""
    config = _config(tmp_path / "root")
    async with running(Daemon(config, handle_signals=False)):
        with pytest.raises(DaemonAlreadyRunning, match=rf"^another daemon \(pid {os.getpid()}\)"):
            await Daemon(config, handle_signals=False).run()


async def test_drain_request_stops_the_daemon(tmp_path: Path) -> None:
    """The control API's drain makes `run` return 0; the answer says who asked (the caller's
    uid and pid, from the socket)."""
    config = _config(tmp_path / "root")
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        codes: list[int] = []

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            codes.append(await daemon.run(task_status=task_status))

        await tg.start(run)
        async with ControlClient(config.control_socket) as client:
            answer = await client.call("drain")
    assert answer["draining"] is True
    assert (answer["decided_by"]["uid"], answer["decided_by"]["pid"]) == (os.getuid(), os.getpid())
    assert codes == [0]


async def test_sighup_reloads_reloadable_keys(tmp_path: Path, log_stream: io.StringIO) -> None:
    """SIGHUP re-reads the config file: reloadable keys apply, others are reported."""
    root = tmp_path / "root"
    config_file = tmp_path / "hunter.toml"
    config_file.write_text("[retry]\nbase_delay_ms = 100\n")
    config = load_config(config_file, env={}, overrides={"root": root})
    daemon = Daemon(config, config_path=config_file, overrides={"root": root})
    async with running(daemon):
        assert daemon.turn_core is not None
        assert daemon.turn_core.settings.retry.base_delay_ms == 100
        config_file.write_text("[retry]\nbase_delay_ms = 7\n[executors]\nqueue_capacity = 5\n")
        reloaded = daemon.reloaded
        os.kill(os.getpid(), signal.SIGHUP)
        with anyio.fail_after(10):
            await reloaded.wait()
        assert daemon.turn_core.settings.retry.base_delay_ms == 7
        assert daemon.config.executors.queue_capacity == config.executors.queue_capacity
    events = _events(log_stream)
    assert "config_reloaded" in events
    assert "config_reload_partial" in events


_ACTIVATE = textwrap.dedent(
    """
    import os, sys
    control, executors = int(sys.argv[1]), int(sys.argv[2])
    os.dup2(control, 3)
    os.dup2(executors, 4)
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="2",
                      LISTEN_FDNAMES="control:executors")
    from supervisor.cli import main
    raise SystemExit(main(sys.argv[3:]))
    """
)


async def test_socket_activation(tmp_path: Path) -> None:
    """With LISTEN_FDS the daemon serves the sockets it was given and leaves their files."""
    root = tmp_path / "root"
    run_dir = tmp_path / "act"
    run_dir.mkdir()
    sockets = []
    for name in ("control", "executors"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(run_dir / f"{name}.sock"))
        sock.listen()
        sock.set_inheritable(True)
        sockets.append(sock)
    try:
        fds = [s.fileno() for s in sockets]
        proc = await anyio.open_process(
            [
                sys.executable,
                "-c",
                _ACTIVATE,
                str(fds[0]),
                str(fds[1]),
                "serve",
                "--root",
                str(root),
                "--log-format",
                "json",
            ],
            pass_fds=fds,
            env={k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")},
        )
        try:
            with anyio.fail_after(20):
                async with ControlClient(run_dir / "control.sock") as client:
                    pong = await client.call("ping")
            assert pong["pid"] == proc.pid
            assert not socket_for_root(root).exists()
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()
    finally:
        for sock in sockets:
            sock.close()
    assert (run_dir / "control.sock").exists()


def test_invalid_config_exits_2_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hunter serve` with an invalid config names the key, exits 2 and creates nothing."""
    from supervisor.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("drain_grace_s = -5\n")
    root = tmp_path / "root"
    assert main(["serve", "--root", str(root), "--config", str(bad)]) == 2
    assert "drain_grace_s" in capsys.readouterr().err
    assert not root.exists()


async def test_clean_stop_logs_nothing_at_warning_or_above() -> None:
    """`hunter serve` started, given work, then stopped with SIGTERM exits 0, and its log has no
    event at warning or above (a shutdown once logged an InvalidStateError from a hand-made
    thread-to-loop hand-off)."""
    import shutil
    import tempfile

    from supervisor.demo.stack import prepare_root

    # Process turns run under their own uid: the root must be reachable by it.
    base = Path(tempfile.mkdtemp(prefix="hh-stop-"))
    os.chmod(base, 0o711)
    try:
        prepare_root(base / "root", fresh=True)
        events = await _serve_work_and_stop(base / "root")
    finally:
        shutil.rmtree(base, ignore_errors=True)

    ready = next(e for e in events if e["event"] == "daemon_ready")
    # `hunter serve` settled its heap (supervisor/heap.py) before it said it was ready
    assert ready["gc_threshold"] == list(THRESHOLD)


async def _serve_work_and_stop(root: Path) -> list[dict[str, Any]]:
    proc = await anyio.open_process(
        [sys.executable, "-m", "supervisor", "serve", "--root", str(root), "--log-format", "json"],
        env={k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")},
    )
    try:
        with anyio.fail_after(30):
            while not socket_for_root(root).exists():
                assert proc.returncode is None, "the daemon exited at start"
                await anyio.sleep(0.05)
            async with ControlClient(socket_for_root(root)) as client:
                sid = (await client.call("session.open", package_id="demo"))["session_id"]
                turn = await client.call(
                    "turn.submit",
                    session_id=sid,
                    kind="process",
                    argv=["/bin/true"],
                    declared_outputs=[],
                    wait_s=20,
                )
                assert turn["turn"]["state"] == "succeeded"
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await proc.wait() == 0
        assert proc.stdout is not None
        output = b""
        async for chunk in proc.stdout:
            output += chunk
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()
    events = [orjson.loads(line) for line in output.splitlines() if line.startswith(b"{")]
    assert any(e["event"] == "daemon_stopped" for e in events)
    loud = [e for e in events if e["level"] in {"warning", "error", "critical", "exception"}]
    assert loud == []
    return events


async def test_the_anyio_read_race_is_a_warning(tmp_path: Path, log_stream: io.StringIO) -> None:
    """asyncio's report of a cancelled read's late callback (InvalidStateError from
    Future.set_result) is logged as loop_callback_race at warning level; any other callback
    error still reaches asyncio's own handler."""
    import asyncio

    config = _config(tmp_path / "root")
    async with running(Daemon(config, handle_signals=False)):
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        future.cancel()
        loop.call_soon(future.set_result, None)  # the race, for real: a late set_result
        await anyio.sleep(0.05)
        handler = loop.get_exception_handler()
        assert handler is not None
    lines = [orjson.loads(line) for line in log_stream.getvalue().splitlines() if line]
    races = [e for e in lines if e["event"] == "loop_callback_race"]
    assert races
    assert races[0]["level"] == "warning"
    assert not [e for e in lines if e["level"] in {"error", "critical"}]


async def test_the_read_race_during_a_stop_is_not_a_warning(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """Once the daemon stops, every connection's read is cancelled and the race is expected:
    it is not logged at warning (nor as asyncio's error), so a clean stop stays quiet."""
    import asyncio

    config = _config(tmp_path / "root")
    daemon = Daemon(config, handle_signals=False)
    async with running(daemon):
        loop = asyncio.get_running_loop()
        daemon.request_drain()
        await anyio.wait_all_tasks_blocked()
        future: asyncio.Future[None] = loop.create_future()
        future.cancel()
        loop.call_soon(future.set_result, None)  # the race, while the daemon stops
        await anyio.sleep(0.05)
    lines = [orjson.loads(line) for line in log_stream.getvalue().splitlines() if line]
    assert any(e["event"] == "daemon_stopped" for e in lines)
    assert not [e for e in lines if e["level"] in {"warning", "error", "critical"}]
