"""Escapes through sockets and the kernel's own interfaces: each test is a real attempt from a
sandboxed turn, with a real listener outside, and each denial must be on the evidence record."""

from __future__ import annotations

import errno
import json
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from sandbox.runtime import Runtime, RuntimeConfig, Session, TurnResult

pytestmark = pytest.mark.usefixtures("sandboxed", "system_python")

SYSTEM_PYTHON = "/usr/bin/python3"
TIMEOUT_MS = 10_000
Installer = Callable[..., Path]

CONNECT = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "try:\n"
    "    s.connect(sys.argv[1]); print('connected')\n"
    "except OSError as e:\n"
    "    print('errno', e.errno)\n"
)


@pytest.fixture
def listener(world: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A listening pathname socket, mode 0777, in a world-writable directory outside."""
    directory = world / "run-outside"
    directory.mkdir()
    directory.chmod(0o777)
    path = directory / "bus.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen()
    server.setblocking(False)
    try:
        yield path, server
    finally:
        server.close()


async def py(session: Session, code: str, *args: str) -> TurnResult:
    """Run the system Python with *code* as a turn that declares no outputs."""
    return await session.run_process_turn(
        [SYSTEM_PYTHON, "-c", code, *args], declared_outputs=[], timeout_ms=TIMEOUT_MS
    )


def evidence_violations(session: Session) -> list[dict[str, Any]]:
    """Every ``capability_violation`` entry of the session's evidence ledger."""
    path = session.ledgers.session_dir / "ledger" / "evidence.jsonl"
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [e for e in entries if e.get("kind") == "capability_violation"]


async def test_connect_to_world_writable_socket_outside_is_denied_and_recorded(
    session: Session, listener: tuple[Path, socket.socket]
) -> None:
    """connect() to a 0777 socket outside fails with EACCES, nothing is accepted, and the
    denial is a violation in the result and the evidence ledger, naming seccomp."""
    path, server = listener
    result = await py(session, CONNECT, str(path))
    assert result.stdout.strip() == f"errno {errno.EACCES}", result.stderr
    with pytest.raises(BlockingIOError):
        server.accept()
    assert result.status == "violation"
    assert result.fault_type == "SECURITY_VIOLATION"
    [violation] = result.violations
    assert (violation.operation, violation.target) == ("connect", str(path))
    assert violation.capability == "capabilities.unix_sockets"
    assert result.enforcement["unix_sockets"] == "seccomp-user-notif"
    [entry] = evidence_violations(session)
    assert entry["turn_number"] == result.turn_number
    assert entry["session_id"] == session.session_id
    [recorded] = entry["capability_violations"]
    assert recorded["operation"] == "connect"
    assert recorded["target"] == str(path)
    assert recorded["capability"] == "capabilities.unix_sockets"
    assert "seccomp-user-notif" in recorded["detail"]
    assert isinstance(recorded["timestamp_us"], int)


async def test_manifest_grant_allows_the_connect(
    runtime: Runtime, install: Installer, listener: tuple[Path, socket.socket]
) -> None:
    """With ``unix_sockets: true`` in the manifest the same connect succeeds."""
    path, server = listener
    install(
        "sockets",
        capabilities={
            "read": [],
            "write": ["**"],
            "execute": ["/usr/bin/*", "/bin/*"],
            "forbidden": [],
            "unix_sockets": True,
        },
    )
    with runtime.open_session("sockets") as session:
        result = await py(session, CONNECT, str(path))
        assert result.stdout.strip() == "connected", result.stderr
        assert result.status == "succeeded"
        assert result.enforcement["unix_sockets"] == "granted"
        conn, _ = server.accept()
        conn.close()


async def test_glibc_nscd_probe_is_not_a_violation(session: Session) -> None:
    """A lookup of users (glibc tries the nscd socket, which does not exist) still works and
    is no violation: a connect to a path that does not exist is refused (EACCES, the same
    answer as for any path, so it tells nothing) but not recorded."""
    result = await session.run_process_turn(
        ["/bin/ls", "-l", "/usr"], declared_outputs=[], timeout_ms=TIMEOUT_MS
    )
    assert result.status == "succeeded", result.stderr
    missing = await py(session, CONNECT, "/nonexistent/hunter.sock")
    assert missing.stdout.strip() == f"errno {errno.EACCES}"
    assert missing.status == "succeeded"
    assert evidence_violations(session) == []


async def test_unix_datagram_sockets_cannot_be_made(session: Session, world: Path) -> None:
    """No datagram Unix socket (it could sendto() a path such as /dev/log without connect):
    socket() and socketpair() both fail with EACCES and are recorded."""
    target = world / "log.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(target))
        target.chmod(0o777)
        server.setblocking(False)
        code = (
            "import socket, sys\n"
            "for make in (lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM),\n"
            "             lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0],\n"
            "             lambda: socket.socket(socket.AF_UNIX, socket.SOCK_RAW)):\n"
            "    try:\n"
            "        s = make(); s.sendto(b'leak', sys.argv[1]); print('sent')\n"
            "    except OSError as e:\n"
            "        print('errno', e.errno)\n"
        )
        result = await py(session, code, str(target))
        assert result.stdout.split() == ["errno", str(errno.EACCES)] * 3, result.stderr
        with pytest.raises(BlockingIOError):
            server.recv(16)
    assert result.status == "violation"
    assert [v.operation for v in result.violations] == ["socket", "socketpair", "socket"]


async def test_io_uring_is_refused(session: Session) -> None:
    """io_uring (whose socket and connect operations bypass seccomp) cannot be set up."""
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "fd = libc.syscall(425, 8, params)\n"
        "print(fd, ctypes.get_errno())\n"
    )
    result = await py(session, code)
    assert result.stdout.split() == ["-1", str(errno.EPERM)], result.stderr


async def test_tcp_connect_without_network_is_denied_and_recorded(session: Session) -> None:
    """A TCP connect to the host's loopback without the network grant fails with EACCES (the
    supervisor answers it; it never connects for the turn) and is recorded with its address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "s = socket.socket()\n"
            "try:\n"
            f"    s.connect(('127.0.0.1', {port})); print('connected')\n"
            "except OSError as e:\n"
            "    print('errno', e.errno)\n"
        )
        result = await py(session, code)
        assert result.stdout.strip() == f"errno {errno.EACCES}", result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    assert result.status == "violation"
    [violation] = result.violations
    assert (violation.operation, violation.target) == ("connect", f"127.0.0.1:{port}")
    assert violation.capability == "capabilities.network"


async def test_udp_connect_is_answered_with_the_kernels_result(session: Session) -> None:
    """A UDP connect (glibc's resolver does them to sort addresses) is performed by the
    supervisor on the turn's socket, in the turn's empty network namespace: it fails as it
    would without the filter, and is no violation."""
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        "    s.connect(('10.0.0.1', 53)); print('connected')\n"
        "except OSError as e:\n"
        "    print('errno', e.errno)\n"
    )
    result = await py(session, code)
    assert result.stdout.strip() == f"errno {errno.ENETUNREACH}", result.stderr
    assert result.status == "succeeded"


# -- fork bombs: a PID namespace per turn, the runtime as subreaper ---------------------------


def processes_of_uid(uid: int) -> list[tuple[int, str]]:
    """(pid, status) of every process on the machine with *uid* as its real uid, zombies too."""
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in (uids.real, uids.effective):
            found.append((proc.pid, proc.info["status"]))
    return found


@pytest.mark.parametrize(
    "bomb",
    [
        pytest.param(":(){ :|:& };:; sleep 30", id="shell-bomb-pid1-waits"),
        # bash says "Cannot fork" and the script exits 1: once seen as a FAILURE
        pytest.param("for i in $(seq 64); do sleep 30 & done; exit 1", id="cannot-fork-exit-1"),
    ],
)
async def test_fork_bomb_is_resource_exhausted_every_time_and_leaves_nothing(
    runtime: Runtime, install: Installer, bomb: str
) -> None:
    """A real fork bomb under a pids limit of 32, three times in one session: every turn is
    RESOURCE_EXHAUSTED (escalated), and no process or zombie of the session's uid is left."""
    install(
        "bomb",
        capabilities={
            "read": [],
            "write": ["**"],
            "execute": ["/bin/*", "/usr/bin/*"],
            "forbidden": [],
        },
        limits={"pids": 32},
    )
    assert runtime.levels["pid_namespace"] == "per-turn"
    with runtime.open_session("bomb") as session:
        for turn in range(1, 4):
            result = await session.run_process_turn(
                ["/bin/bash", "-c", bomb], declared_outputs=[], timeout_ms=2_000
            )
            attempt = result.attempts[0]
            assert result.fault_type == "RESOURCE_EXHAUSTED", (turn, result.stderr[-300:])
            assert result.status == "escalated"
            assert attempt.resource_events["pids_max"] > 0
            assert processes_of_uid(session.uid) == []


# -- privilege: setuid binaries, ptrace, the terminal ------------------------------------------


async def test_setuid_root_binary_gives_no_privilege(
    runtime: Runtime, install: Installer, world: Path
) -> None:
    """A setuid-root copy of ``id`` that the turn may execute runs with the turn's uid, not
    root (PR_SET_NO_NEW_PRIVS before execve)."""
    bindir = world / "suid"
    bindir.mkdir(mode=0o755)
    binary = bindir / "id"
    shutil.copy2("/usr/bin/id", binary)
    binary.chmod(0o4755)
    install(
        "suid",
        capabilities={
            "read": [],
            "write": ["**"],
            "execute": [f"{bindir}/*", "/usr/bin/*", "/bin/*"],
            "forbidden": [],
        },
    )
    with runtime.open_session("suid") as session:
        result = await session.run_process_turn(
            [str(binary)], declared_outputs=[], timeout_ms=TIMEOUT_MS
        )
        assert result.status == "succeeded", result.stderr
        assert f"uid={session.uid}" in result.stdout
        assert "euid=0" not in result.stdout
        assert "uid=0(" not in result.stdout


async def test_ptrace_of_a_process_outside_is_denied(session: Session) -> None:
    """PTRACE_ATTACH to a process of the turn's own uid outside the sandbox fails (it is not
    in the turn's PID namespace, and Landlock forbids tracing outside the domain); the target
    is never stopped."""
    target = await anyio.open_process(
        ["sleep", "60"], user=session.uid, group=session.gid, extra_groups=[]
    )
    try:
        code = (
            "import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "rc = libc.ptrace(16, int(sys.argv[1]), None, None)\n"  # PTRACE_ATTACH
            "print(rc, ctypes.get_errno())\n"
        )
        result = await py(session, code, str(target.pid))
        rc, err = result.stdout.split()
        assert rc == "-1", result.stdout
        assert int(err) in (errno.ESRCH, errno.EPERM)
        assert psutil.Process(target.pid).status() != psutil.STATUS_STOPPED
    finally:
        target.kill()
        await target.wait()
        await target.aclose()


async def test_no_terminal_to_inject_into(session: Session) -> None:
    """No tty reaches the turn (TIOCSTI injection, bubblewrap CVE-2017-5226): stdin is
    /dev/null and there is no controlling terminal."""
    code = (
        "import fcntl, os, termios\n"
        "try:\n"
        "    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('injected')\n"
        "except OSError as e:\n"
        "    print('stdin', e.errno)\n"
        "try:\n"
        "    os.open('/dev/tty', os.O_RDWR); print('tty')\n"
        "except OSError as e:\n"
        "    print('tty', e.errno)\n"
    )
    result = await py(session, code)
    lines = result.stdout.split("\n")
    assert lines[0] == f"stdin {errno.ENOTTY}", result.stdout
    assert lines[1] in (f"tty {errno.ENXIO}", f"tty {errno.EACCES}")


async def test_granted_network_tcp_connect_works_through_the_supervisor(
    runtime: Runtime, install: Installer
) -> None:
    """With ``network: true`` a TCP connect to a listener on the host's loopback succeeds (the
    supervisor performs it on the turn's own socket) and data flows over it."""
    install(
        "net",
        capabilities={
            "read": [],
            "write": ["**"],
            "execute": ["/usr/bin/*", "/bin/*"],
            "forbidden": [],
            "network": True,
        },
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "s.sendall(b'hello'); print('sent')\n"
        )
        with runtime.open_session("net") as session:
            result = await py(session, code)
        assert result.stdout.strip() == "sent", result.stderr
        assert result.status == "succeeded"
        conn, _ = server.accept()
        with conn:
            assert conn.recv(16) == b"hello"


async def test_without_a_pid_namespace_the_subreaper_reaps_what_a_turn_orphaned(
    root: Path, install: Installer
) -> None:
    """The Python launcher has no PID namespace: a setsid double-forked sleeper is re-parented
    to the runtime (child subreaper), killed with the turn's cgroup and reaped; no process or
    zombie of the session's uid is left."""
    install("pkg")
    with (
        Runtime(root, config=RuntimeConfig(launcher="python")) as runtime,
        runtime.open_session("pkg") as session,
    ):
        assert runtime.levels["pid_namespace"] == "unavailable"
        assert runtime.levels["subreaper"] == "yes"
        for _ in range(3):
            result = await session.run_process_turn(
                ["/bin/sh", "-c", "setsid sh -c 'sleep 60 & sleep 60 & exit 0' & sleep 0.2"],
                declared_outputs=[],
                timeout_ms=TIMEOUT_MS,
            )
            assert result.status == "succeeded", result.stderr
            assert processes_of_uid(session.uid) == []
