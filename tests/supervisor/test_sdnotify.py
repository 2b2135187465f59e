"""sd_notify, the watchdog and socket activation against real sockets and processes."""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import pytest

from supervisor import sdnotify

_TIMEOUT_S = 10.0


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd's notify socket."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(_TIMEOUT_S)
        yield sock, str(path)


def test_notify_sends_states_as_one_datagram(notify_socket: tuple[socket.socket, str]) -> None:
    """Several states go out newline-separated in a single datagram."""
    sock, path = notify_socket
    assert sdnotify.notify("READY=1", "STATUS=listening", env={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"READY=1\nSTATUS=listening"


def test_notify_uses_os_environ_by_default(
    notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an explicit env, $NOTIFY_SOCKET from the process environment is used."""
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert sdnotify.notify("STOPPING=1")
    assert sock.recv(4096) == b"STOPPING=1"


def test_notify_abstract_socket() -> None:
    """A NOTIFY_SOCKET starting with '@' is an abstract-namespace address."""
    name = f"hunter-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(_TIMEOUT_S)
        assert sdnotify.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_notify_without_socket_is_a_no_op() -> None:
    """No NOTIFY_SOCKET (not under systemd): nothing is sent, False is returned."""
    assert sdnotify.notify("READY=1", env={}) is False
    assert sdnotify.notify(env={"NOTIFY_SOCKET": "/nonexistent"}) is False


def test_notify_unreachable_socket_returns_false(tmp_path: Path) -> None:
    """A notify socket that is gone never raises; the send reports False."""
    env = {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}
    assert sdnotify.notify("READY=1", env=env) is False
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1"}) is False


def test_notify_rejects_multiline_state() -> None:
    """A state containing a newline would smuggle in another assignment: refused."""
    with pytest.raises(ValueError, match=r"^a notify state must be one line"):
        sdnotify.notify("STATUS=a\nREADY=1", env={})


def test_watchdog_interval_parses_usec() -> None:
    """WATCHDOG_USEC is the full interval, in seconds."""
    pid = str(os.getpid())
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) == 30.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "500000"}) == 0.5


def test_watchdog_interval_off_cases() -> None:
    """No variable, another process's pid, garbage or zero: the watchdog is off."""
    assert sdnotify.watchdog_interval({}) is None
    other = str(os.getpid() + 1)
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": other}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None


async def test_watchdog_loop_pings_from_the_event_loop(
    notify_socket: tuple[socket.socket, str],
) -> None:
    """The loop reports half the interval as its period and sends WATCHDOG=1 repeatedly."""
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"}
    async with anyio.create_task_group() as tg:
        period = await tg.start(
            lambda task_status: sdnotify.watchdog_loop(env=env, task_status=task_status)
        )
        assert period == 0.01
        for _ in range(3):
            assert await anyio.to_thread.run_sync(sock.recv, 4096) == b"WATCHDOG=1"
        tg.cancel_scope.cancel()


async def test_watchdog_loop_skips_pings_when_unhealthy(
    notify_socket: tuple[socket.socket, str],
) -> None:
    """While `healthy()` says False no ping is sent; pings resume when it says True."""
    sock, path = notify_socket
    answers = iter([False, False, True])
    asked = anyio.Event()

    def healthy() -> bool:
        answer = next(answers, True)
        if answer:
            asked.set()
        return answer

    env = {"NOTIFY_SOCKET": path}
    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: sdnotify.watchdog_loop(
                interval=0.01, healthy=healthy, env=env, task_status=task_status
            )
        )
        await asked.wait()
        assert await anyio.to_thread.run_sync(sock.recv, 4096) == b"WATCHDOG=1"
        tg.cancel_scope.cancel()
    with pytest.raises(StopIteration):
        next(answers)


async def test_watchdog_loop_returns_when_disabled() -> None:
    """Without WATCHDOG_USEC the loop starts with None and returns at once."""
    async with anyio.create_task_group() as tg:
        assert (
            await tg.start(
                lambda task_status: sdnotify.watchdog_loop(env={}, task_status=task_status)
            )
            is None
        )


def test_listen_fds_ignores_foreign_pid() -> None:
    """Variables meant for another pid yield nothing and are removed all the same."""
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "control"}
    assert sdnotify.listen_fds(environ=env) == {}
    assert env == {}


def test_listen_fds_without_variables() -> None:
    """Not socket-activated: an empty dict; unset_environment=False leaves the env alone."""
    env = {"LISTEN_FDS": "garbage", "OTHER": "1"}
    assert sdnotify.listen_fds(environ=env, unset_environment=False) == {}
    assert env == {"LISTEN_FDS": "garbage", "OTHER": "1"}


_CHILD = textwrap.dedent(
    """
    import os, sys
    from supervisor import sdnotify
    names = sys.argv[1]
    for i, fd in enumerate(int(x) for x in sys.argv[2:]):
        os.dup2(fd, 3 + i, inheritable=True)
        os.close(fd)
    os.environ["LISTEN_PID"] = str(os.getpid())
    os.environ["LISTEN_FDS"] = str(len(sys.argv) - 2)
    if names != "-":
        os.environ["LISTEN_FDNAMES"] = names
    socks = sdnotify.listen_fds()
    left = [v for v in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES") if v in os.environ]
    for name, sock in sorted(socks.items()):
        assert not os.get_inheritable(sock.fileno()), name
        conn, _ = sock.accept()
        with conn:
            conn.sendall(name.encode())
        sock.close()
    sys.stdout.write(" ".join(sorted(socks)) + "|" + ",".join(left))
    """
)


def _listeners(tmp_path: Path, count: int) -> list[tuple[socket.socket, Path]]:
    out = []
    for i in range(count):
        path = tmp_path / f"s{i}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen()
        out.append((sock, path))
    return out


def _run_child(names: str, listeners: list[tuple[socket.socket, Path]]) -> subprocess.Popen[str]:
    fds = [sock.fileno() for sock, _ in listeners]
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, names, *map(str, fds)],
        pass_fds=fds,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")},
    )


def _greeting(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(_TIMEOUT_S)
        client.connect(str(path))
        return client.recv(64)


def test_listen_fds_in_a_real_process(tmp_path: Path) -> None:
    """A child given fds 3 and 4 with LISTEN_* variables gets named, accepting, CLOEXEC sockets."""
    listeners = _listeners(tmp_path, 2)
    try:
        child = _run_child("control:executors", listeners)
        try:
            assert _greeting(listeners[0][1]) == b"control"
            assert _greeting(listeners[1][1]) == b"executors"
            out, _ = child.communicate(timeout=_TIMEOUT_S)
        finally:
            child.kill()
            child.wait(timeout=_TIMEOUT_S)
            if child.stdout is not None:
                child.stdout.close()
    finally:
        for sock, _ in listeners:
            sock.close()
    assert child.returncode == 0
    assert out == "control executors|"


def test_listen_fds_unnamed_and_duplicate_names(tmp_path: Path) -> None:
    """Missing names become 'unknown'; a repeated name gets '#2'."""
    listeners = _listeners(tmp_path, 3)
    try:
        child = _run_child("dup:dup", listeners)
        try:
            greetings = [_greeting(path) for _, path in listeners]
            out, _ = child.communicate(timeout=_TIMEOUT_S)
        finally:
            child.kill()
            child.wait(timeout=_TIMEOUT_S)
            if child.stdout is not None:
                child.stdout.close()
    finally:
        for sock, _ in listeners:
            sock.close()
    assert greetings == [b"dup", b"dup#2", b"unknown"]
    assert out == "dup dup#2 unknown|"


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None,
    reason="systemd-socket-activate is not installed (package systemd)",
)
def test_listen_fds_under_systemd_socket_activate(tmp_path: Path) -> None:
    """systemd's own socket activator passes a socket our listen_fds() finds by name."""
    path = tmp_path / "control.sock"
    script = textwrap.dedent(
        """
        import sys
        from supervisor import sdnotify
        socks = sdnotify.listen_fds()
        conn, _ = socks["control"].accept()
        with conn:
            conn.sendall(b"hello from " + ",".join(socks).encode())
        for s in socks.values():
            s.close()
        """
    )
    proc = subprocess.Popen(
        [
            "systemd-socket-activate",
            "-l",
            str(path),
            "--fdname=control",
            sys.executable,
            "-c",
            script,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "Listening on" in _read_line(proc.stderr)
        assert _greeting(path) == b"hello from control"
        proc.wait(timeout=_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait(timeout=_TIMEOUT_S)
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 0


def _read_line(pipe: IO[str]) -> str:
    """One line from `pipe`, waiting at most _TIMEOUT_S for it to be readable."""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        if not sel.select(_TIMEOUT_S):
            pytest.fail("systemd-socket-activate printed nothing")
    return pipe.readline()
