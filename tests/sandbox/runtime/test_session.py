"""Sandboxed process turns: every escape class is a real attempt that must fail."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from sandbox.confine.cgroups import CgroupLayout
from sandbox.errors import CapabilityViolation, DeclarationError, SandboxUnavailableError
from sandbox.policy.attempts import AgentPhase, RetryOptions
from sandbox.policy.retry_protocol import CountingEntropyDetector
from sandbox.runtime import Runtime, RuntimeConfig, Session, TurnResult
from sandbox.runtime.area import SessionArea
from sandbox.session_ids import new_session_id

pytestmark = pytest.mark.usefixtures("sandboxed")

TIMEOUT_MS = 10_000
SYSTEM_PYTHON = "/usr/bin/python3"


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Parse a JSONL ledger file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def turn_entries(session_dir: Path, turn_number: int) -> dict[str, list[dict[str, Any]]]:
    """Entries of one turn in both ledgers, by ledger name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in ("exec", "evidence"):
        entries = read_ledger(session_dir / "ledger" / f"{name}.jsonl")
        out[name] = [e for e in entries if e.get("turn_number") == turn_number]
    return out


Installer = Callable[..., Path]


async def sh(session: Session, script: str, **kwargs: object) -> TurnResult:
    """Run ``sh -c script`` as a turn that declares no outputs unless told otherwise."""
    kwargs.setdefault("declared_outputs", [])
    kwargs.setdefault("timeout_ms", TIMEOUT_MS)
    return await session.run_process_turn(["/bin/sh", "-c", script], **kwargs)  # type: ignore[arg-type]


async def py(session: Session, code: str, **kwargs: object) -> TurnResult:
    """Run the system Python with *code* as a turn."""
    kwargs.setdefault("declared_outputs", [])
    kwargs.setdefault("timeout_ms", TIMEOUT_MS)
    return await session.run_process_turn([SYSTEM_PYTHON, "-c", code], **kwargs)  # type: ignore[arg-type]


def assert_recorded(session: Session, turn_number: int, status: str) -> dict[str, Any]:
    """Both ledgers hold the turn's entry with *status*; return the evidence turn entry."""
    entries = turn_entries(session.ledgers.session_dir, turn_number)
    exec_turns = [e for e in entries["exec"] if e.get("kind") == "turn"]
    evidence_turns = [e for e in entries["evidence"] if e.get("kind") == "turn"]
    assert len(exec_turns) == 1
    assert len(evidence_turns) == 1
    assert exec_turns[0]["status"] == status
    evidence = dict(evidence_turns[0])
    assert evidence["session_id"] == session.session_id
    assert "enforcement" in evidence
    return evidence


def relative(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` (with ``..`` segments)."""
    return os.path.relpath(path, start)


def violation_entries(session: Session, turn_number: int) -> list[dict[str, Any]]:
    """The capability_violation evidence entries of a turn."""
    entries = turn_entries(session.ledgers.session_dir, turn_number)["evidence"]
    return [dict(e) for e in entries if e.get("kind") == "capability_violation"]


# -- a plain turn ------------------------------------------------------------------


async def test_turn_runs_as_unprivileged_uid_with_fresh_env(session: Session) -> None:
    """The command runs as the session's uid (not root), in output/<sid>, stdin /dev/null."""
    result = await sh(session, "id -u; id -G; pwd; readlink /proc/self/fd/0 || echo nostdin")
    assert result.status == "succeeded"
    uid, groups, cwd, _ = result.stdout.splitlines()
    assert int(uid) == session.uid != 0
    assert groups == str(session.gid)
    assert cwd == str(session.output_dir)
    evidence = assert_recorded(session, 1, "succeeded")
    assert evidence["enforcement"]["landlock"].startswith("abi-")


async def test_secret_in_parent_environment_is_not_visible(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variables of the supervisor's environment do not reach the turn."""
    monkeypatch.setenv("HUNTER_TEST_SECRET", "s3cr3t-value")
    result = await sh(session, "env")
    assert result.status == "succeeded"
    assert "s3cr3t-value" not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["TMPDIR"] == env["TEMP"] == env["TMP"] == env["HOME"] == str(session.tmp_dir)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


@pytest.mark.usefixtures("system_python")
async def test_tmpdir_is_honoured_by_python_tempfile(session: Session) -> None:
    """Python's tempfile puts files in tmp/<sid> and writing there works."""
    code = (
        "import tempfile, sys\n"
        "fd, name = tempfile.mkstemp()\n"
        "print(tempfile.gettempdir()); print(name); print(sys.flags.dont_write_bytecode)\n"
    )
    result = await py(session, code, declared_outputs=[{"path": "tmp/*", "role": "scratch"}])
    assert result.status == "succeeded", result.stderr
    tmpdir, name, no_bytecode = result.stdout.splitlines()
    assert tmpdir == str(session.tmp_dir)
    assert Path(name).parent == session.tmp_dir
    assert no_bytecode == "1"
    assert [w.area for w in result.realized_writes] == ["tmp"]


# -- writes outside the sandbox ------------------------------------------------------------------


async def test_write_outside_by_absolute_path_is_denied(session: Session, outside: Path) -> None:
    """An absolute path outside tmp/<sid> and output/<sid> cannot be created, and the kernel's
    denial is the turn's capability violation (Landlock's audit record)."""
    result = await sh(session, f"echo x > {outside}/abs")
    assert result.status == "violation"
    assert "Permission denied" in result.stderr
    assert not (outside / "abs").exists()
    assert [(v.operation, v.target) for v in result.violations] == [("write", str(outside))]
    assert_recorded(session, 1, "violation")


async def test_write_outside_by_dotdot_is_denied(session: Session, outside: Path) -> None:
    """A relative path climbing out of the sandbox with .. cannot be created."""
    rel = relative(outside / "dotdot", session.output_dir)
    assert rel.startswith("..")
    result = await sh(session, f"echo x > {rel}")
    assert result.status == "violation"
    assert [(v.operation, v.target) for v in result.violations] == [("write", str(outside))]
    assert not (outside / "dotdot").exists()


async def test_write_through_planted_symlink_is_denied(session: Session, outside: Path) -> None:
    """A symlink left in the sandbox is cleared, and the turn cannot make or use one."""
    target = outside / "target"
    target.write_text("original")
    target.chmod(0o666)
    (session.output_dir / "link").symlink_to(target)
    result = await sh(session, f"echo pwned >> link; ln -s {target} link2; echo pwned >> link2")
    assert target.read_text() == "original"
    assert "Permission denied" in result.stderr
    assert result.status == "violation"  # `link` became an undeclared regular file
    assert [w.path for w in result.realized_writes] == ["link", "link2"]


async def test_write_through_preexisting_hard_link_is_denied(
    session: Session, outside: Path
) -> None:
    """A hard link to an outside file planted in the sandbox is removed before the turn."""
    target = outside / "hard"
    target.write_text("original")
    target.chmod(0o666)
    assert isinstance(session.area, SessionArea)
    if session.area.disk_mounted:  # on the session disk (its own tmpfs) it cannot exist
        with pytest.raises(OSError, match=r"Invalid cross-device link"):
            os.link(target, session.output_dir / "hard")
    else:
        os.link(target, session.output_dir / "hard")
    result = await sh(session, "echo pwned >> hard; ln ../../../outside/hard again || true")
    assert target.read_text() == "original"
    assert target.stat().st_nlink == 1
    assert result.status == "violation"


async def test_rename_across_directories_is_denied(session: Session, outside: Path) -> None:
    """Files cannot be moved out of the sandbox nor outside files moved in."""
    victim = outside / "victim"
    victim.write_text("keep")
    victim.chmod(0o666)
    result = await sh(
        session, f"echo data > out.txt; mv out.txt {outside}/moved; mv {victim} stolen; ls"
    )
    assert not (outside / "moved").exists()
    assert victim.read_text() == "keep"
    assert "stolen" not in result.stdout


async def test_write_into_proc_self_is_denied(session: Session, outside: Path) -> None:
    """/proc/self/root and /proc/self files are not a way around Landlock."""
    result = await sh(
        session, f"echo x > /proc/self/root{outside}/viaproc; echo evil > /proc/self/comm"
    )
    assert not (outside / "viaproc").exists()
    assert result.stderr.count("Permission denied") == 2


# -- reads ------------------------------------------------------------------


async def test_forbidden_file_inside_readable_tree_cannot_be_read(
    runtime: Runtime, install: Installer, world: Path
) -> None:
    """forbidden wins over read, also inside a readable directory (Landlock carve-out)."""
    data = world / "data"
    (data / "sub").mkdir(parents=True)
    (data / "ok.txt").write_text("visible")
    (data / "secret.txt").write_text("TOPSECRET")
    (data / "sub" / "deep.txt").write_text("deep")
    for path in (data, data / "sub"):
        path.chmod(0o755)
    for path in (data / "ok.txt", data / "secret.txt", data / "sub" / "deep.txt"):
        path.chmod(0o644)
    install(
        "reader",
        capabilities={
            "read": [f"{data}/**"],
            "write": ["**"],
            "execute": ["/usr/bin/*", "/bin/*"],
            "forbidden": [f"{data}/secret.txt"],
        },
    )
    with runtime.open_session("reader") as session:
        result = await sh(session, f"cat {data}/ok.txt {data}/sub/deep.txt; cat {data}/secret.txt")
        assert "visible" in result.stdout
        assert "deep" in result.stdout
        assert "TOPSECRET" not in result.stdout
        assert "Permission denied" in result.stderr


async def test_read_outside_read_roots_is_denied(session: Session, world: Path) -> None:
    """A world-readable file outside every read root cannot be read."""
    other = world / "other.txt"
    other.write_text("not yours")
    other.chmod(0o644)
    result = await sh(session, f"cat {other}")
    assert result.status == "violation"
    assert "not yours" not in result.stdout
    [violation] = result.violations
    assert (violation.operation, violation.target) == ("read", str(other))
    assert violation.capability == "capabilities.read"


# -- execute ------------------------------------------------------------------


async def test_command_not_in_execute_is_rejected_and_recorded(
    runtime: Runtime, install: Installer
) -> None:
    """A command outside capabilities.execute is rejected before it runs; evidence written."""
    install(
        "narrow",
        capabilities={"read": [], "write": ["**"], "execute": ["/usr/bin/true"], "forbidden": []},
    )
    with runtime.open_session("narrow") as session:
        result = await session.run_process_turn(
            ["/usr/bin/env"], declared_outputs=[], timeout_ms=TIMEOUT_MS
        )
        assert result.status == "rejected"
        assert result.attempts == ()
        (violation,) = result.violations
        assert violation.capability == "capabilities.execute"
        assert violation.session_id == session.session_id
        assert violation.turn_number == 1
        with pytest.raises(CapabilityViolation, match=r"^execute '/usr/bin/env' violates"):
            result.raise_for_violation()
        assert_recorded(session, 1, "rejected")
        (entry,) = violation_entries(session, 1)
        recorded = entry["capability_violations"][0]
        assert recorded["operation"] == "execute"
        assert recorded["capability"] == "capabilities.execute"
        assert isinstance(recorded["timestamp_us"], int)


async def test_shell_cannot_execute_programs_outside_execute(
    runtime: Runtime, install: Installer
) -> None:
    """Landlock EXECUTE: an allowed shell cannot start a program the manifest does not allow."""
    install(
        "shonly",
        capabilities={"read": [], "write": ["**"], "execute": ["/bin/sh"], "forbidden": []},
    )
    with runtime.open_session("shonly") as session:
        result = await sh(session, "/usr/bin/id; echo rc=$?")
        assert "rc=126" in result.stdout


async def test_forbidden_command_is_rejected(runtime: Runtime, install: Installer) -> None:
    """forbidden wins over execute."""
    install(
        "nocurl",
        capabilities={
            "read": [],
            "write": ["**"],
            "execute": ["/usr/bin/*"],
            "forbidden": ["/usr/bin/env"],
        },
    )
    with runtime.open_session("nocurl") as session:
        result = await session.run_process_turn(["env"], declared_outputs=[], timeout_ms=TIMEOUT_MS)
        assert result.status == "rejected"
        assert result.violations[0].capability == "capabilities.forbidden"


# -- declarations ------------------------------------------------------------------


async def test_missing_declared_outputs_field_is_rejected(session: Session) -> None:
    """declared_outputs is required (FR-RT-013); the rejected turn is in both ledgers."""
    result = await session.run_process_turn(
        ["/bin/true"], declared_outputs=None, timeout_ms=TIMEOUT_MS
    )
    assert result.status == "rejected"
    assert result.reason_code == "DECLARATION_INVALID"
    assert_recorded(session, 1, "rejected")


async def test_declared_output_outside_write_capability_is_rejected(
    runtime: Runtime, install: Installer
) -> None:
    """A declared path must match capabilities.write and not forbidden."""
    install(
        "reports",
        capabilities={
            "read": [],
            "write": ["reports/**"],
            "execute": ["/bin/*", "/usr/bin/*"],
            "forbidden": ["reports/secret/**"],
        },
    )
    with runtime.open_session("reports") as session:
        bad = await sh(session, "true", declared_outputs=[{"path": "other.txt", "role": "x"}])
        forbidden = await sh(
            session, "true", declared_outputs=[{"path": "reports/secret/k", "role": "x"}]
        )
        assert bad.status == forbidden.status == "rejected"
        assert bad.violations[0].capability == "capabilities.write"
        assert forbidden.violations[0].capability == "capabilities.forbidden"
        assert len(violation_entries(session, 1)) == len(violation_entries(session, 2)) == 1


def test_check_turn_request_records_then_raises(session: Session) -> None:
    """The intake check records a violation in evidence before raising it."""
    with pytest.raises(DeclarationError, match=r"^declared_outputs\[0\]\.path: must be a rel"):
        session.check_turn_request(["/bin/true"], [{"path": "/etc/x", "role": "r"}])
    with pytest.raises(CapabilityViolation, match=r"^execute 'nope-not-a-command' violates"):
        session.check_turn_request(["nope-not-a-command"], [], turn_number=7)
    (entry,) = violation_entries(session, 7)
    assert entry["capability_violations"][0]["target"] == "nope-not-a-command"


# -- network, sockets, signals -------------------------------------------------------------------


@pytest.mark.usefixtures("system_python")
async def test_tcp_connect_is_denied(session: Session) -> None:
    """No TCP: a listener on the host's loopback is unreachable."""
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
        assert "connected" not in result.stdout
        assert result.stdout.startswith("errno")
        with pytest.raises(BlockingIOError):
            server.accept()


@pytest.mark.usefixtures("system_python")
async def test_udp_packet_never_reaches_the_host(session: Session) -> None:
    """No UDP: sendto fails in the empty network namespace and no packet arrives."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "try:\n"
            f"    s.sendto(b'leak', ('127.0.0.1', {port})); print('sent')\n"
            "except OSError as e:\n"
            "    print('errno', e.errno)\n"
        )
        result = await py(session, code)
        assert result.stdout.strip() == f"errno {errno.ENETUNREACH}"
        with pytest.raises(BlockingIOError):
            server.recv(100)


@pytest.mark.usefixtures("system_python")
async def test_unix_sockets_of_the_supervisor_are_unreachable(
    runtime: Runtime, session: Session, world: Path
) -> None:
    """Pathname Unix sockets owned by root with mode 0660 cannot be connected to."""
    sockdir = world / "run"
    sockdir.mkdir(mode=0o755)
    in_root = runtime.root / "run"
    in_root.mkdir(mode=0o755, exist_ok=True)
    paths = [sockdir / "control.sock", in_root / "executors.sock"]
    servers = []
    try:
        for path in paths:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            servers.append(server)
            server.bind(str(path))
            path.chmod(0o660)
            server.listen()
            server.setblocking(False)
        code = (
            "import socket, sys\n"
            "for p in sys.argv[1:]:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(p); print('connected', p)\n"
            "    except OSError as e:\n"
            "        print('errno', e.errno)\n"
        )
        result = await session.run_process_turn(
            [SYSTEM_PYTHON, "-c", code, *map(str, paths)],
            declared_outputs=[],
            timeout_ms=TIMEOUT_MS,
        )
        assert result.stdout.split("\n")[:2] == [f"errno {errno.EACCES}"] * 2
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in servers:
            server.close()


@pytest.mark.usefixtures("system_python")
async def test_abstract_unix_socket_of_the_host_is_unreachable(session: Session) -> None:
    """An abstract-namespace socket of the supervisor cannot be connected to."""
    name = f"hunter-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen()
        server.setblocking(False)
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect('\\0{name}'); print('connected')\n"
            "except OSError as e:\n"
            "    print('errno', e.errno)\n"
        )
        result = await py(session, code)
        assert result.stdout.startswith("errno"), result.stdout + result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()


async def test_processes_outside_cannot_be_signalled(session: Session) -> None:
    """Neither root's processes nor a process of the turn's own uid outside it can be killed."""
    as_root = await anyio.open_process(["sleep", "60"])
    same_uid = await anyio.open_process(
        ["sleep", "60"], user=session.uid, group=session.gid, extra_groups=[]
    )
    try:
        result = await sh(
            session, f"kill -TERM {as_root.pid}; echo a=$?; kill -TERM {same_uid.pid}; echo b=$?"
        )
        assert "a=1" in result.stdout
        assert "b=1" in result.stdout
        assert as_root.returncode is None
        assert same_uid.returncode is None
    finally:
        for proc in (as_root, same_uid):
            proc.kill()
            await proc.wait()
            await proc.aclose()


# -- limits and the process tree ------------------------------------------------------------------


@pytest.mark.usefixtures("system_python")
async def test_timeout_gives_a_sigterm_handler_its_grace(session: Session) -> None:
    """At the deadline a command that handles SIGTERM gets it and the grace to clean up (one
    that does not is killed at once: `test_daemon_e2e.py`, attempts carry their own times)."""
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('cleaned up', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(120)\n"
    )
    result = await py(session, code, timeout_ms=800, phase=AgentPhase.RED)
    assert result.status == "timeout"
    assert "cleaned up" in result.stdout


@pytest.mark.usefixtures("system_python")
async def test_timeout_kills_setsid_double_fork_grandchild(session: Session) -> None:
    """A grandchild that called setsid and double-forked dies with the turn."""
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "        print(os.readlink('/proc/self'), flush=True)\n"  # the host pid
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(120)\n"
    )
    result = await py(session, code, timeout_ms=1500, phase=AgentPhase.RED)
    assert result.status == "timeout"
    assert result.attempts[0].timed_out
    grandchild = int(result.stdout.split()[0])
    try:
        proc = psutil.Process(grandchild)
    except psutil.NoSuchProcess:
        pass
    else:
        assert proc.status() == psutil.STATUS_ZOMBIE
    assert_recorded(session, 1, "timeout")


@pytest.mark.usefixtures("system_python")
async def test_fork_bomb_hits_the_pids_limit(runtime: Runtime, install: Installer) -> None:
    """Forking past the pids limit is RESOURCE_EXHAUSTED (escalated), and nothing survives."""
    install(
        "bomb",
        capabilities={"read": [], "write": ["**"], "execute": ["/usr/bin/*"], "forbidden": []},
        limits={"pids": 16},
    )
    code = (
        "import os, sys, time\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        sys.exit(3)\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
    )
    with runtime.open_session("bomb") as session:
        result = await py(session, code)
        assert result.fault_type == "RESOURCE_EXHAUSTED"
        assert result.status == "escalated"
        attempt = result.attempts[0]
        assert attempt.resource_events["pids_max"] > 0
        # the forked sleepers die with the turn's PID 1 (its own PID namespace): none is left
        assert attempt.leftover_processes == 0
        assert_recorded(session, 1, "escalated")


@pytest.mark.usefixtures("system_python")
async def test_memory_hog_hits_the_memory_limit(runtime: Runtime, install: Installer) -> None:
    """Allocating past the memory limit is RESOURCE_EXHAUSTED."""
    install(
        "hog",
        capabilities={"read": [], "write": ["**"], "execute": ["/usr/bin/*"], "forbidden": []},
        limits={"memory_mb": 48},
    )
    with runtime.open_session("hog") as session:
        result = await py(session, "b = b'x' * (400 << 20)\nprint(len(b))")
        assert result.fault_type == "RESOURCE_EXHAUSTED"
        assert result.status == "escalated"
        assert result.attempts[0].resource_events["oom_kill"] > 0


async def test_disk_fill_hits_the_file_size_limit(runtime: Runtime, install: Installer) -> None:
    """A file growing past file_size_mb is stopped (SIGXFSZ) and is RESOURCE_EXHAUSTED."""
    install(
        "fill",
        capabilities={"read": [], "write": ["**"], "execute": ["/usr/bin/*"], "forbidden": []},
        limits={"file_size_mb": 1},
    )
    with runtime.open_session("fill") as session:
        result = await sh(
            session,
            "/usr/bin/head -c 8000000 /dev/zero > big",
            declared_outputs=[{"path": "big", "role": "data"}],
        )
        assert result.status == "escalated"
        assert result.fault_type == "RESOURCE_EXHAUSTED"
        assert result.attempts[0].resource_exhausted
        (big,) = result.realized_writes
        assert big.size == 1 << 20


# -- the write surface ------------------------------------------------------------------


async def test_exact_match_promotes_outputs(session: Session) -> None:
    """Declared == realized: the outputs are promoted into the workspace, root-owned."""
    result = await sh(
        session,
        "mkdir -p sub && echo hello > a.txt && echo deep > sub/b.txt",
        declared_outputs=[{"path": "a.txt", "role": "report"}, {"path": "sub/b.txt", "role": "x"}],
    )
    assert result.status == "succeeded", result.stderr
    assert {p.path for p in result.promoted_outputs} == {"a.txt", "sub/b.txt"}
    promoted = session.workspace / "a.txt"
    assert promoted.read_text() == "hello\n"
    st = promoted.stat()
    assert st.st_uid == os.geteuid()
    assert not st.st_mode & stat.S_IWOTH
    assert (session.workspace / "sub" / "b.txt").read_text() == "deep\n"
    evidence = assert_recorded(session, 1, "succeeded")
    assert [w["path"] for w in evidence["realized_writes"]] == ["a.txt", "sub/b.txt"]
    header = evidence["prompt_header"]
    assert header["session_id"] == session.session_id
    assert header["turn_number"] == 1
    assert header["declared_outputs"] == [
        {"path": "a.txt", "role": "report"},
        {"path": "sub/b.txt", "role": "x"},
    ]
    assert "context_as_of" in header
    assert evidence["declared_writes"] == [
        {"path": "a.txt", "role": "report"},
        {"path": "sub/b.txt", "role": "x"},
    ]


async def test_promotion_is_all_or_nothing(session: Session) -> None:
    """When a later output cannot be promoted, none is: the workspace is unchanged."""
    (session.workspace / "sub" / "b.txt" / "keep").mkdir(parents=True)  # blocks the rename
    result = await sh(
        session,
        "echo hello > a.txt; mkdir sub; echo deep > sub/b.txt",
        declared_outputs=[{"path": "a.txt", "role": "r"}, {"path": "sub/b.txt", "role": "x"}],
    )
    assert result.status == "violation"
    assert result.reason_code == "PROMOTION_FAILED"
    assert not (session.workspace / "a.txt").exists()
    assert (session.workspace / "sub" / "b.txt" / "keep").is_dir()
    assert sorted(os.listdir(session.workspace / "sub")) == ["b.txt"]
    assert result.promoted_outputs == ()
    evidence = assert_recorded(session, 1, "violation")
    assert evidence["promoted_outputs"] == []


async def test_undeclared_write_blocks_promotion(session: Session) -> None:
    """An extra file in output/<sid> is a violation and nothing is promoted."""
    result = await sh(
        session,
        "echo a > a.txt; echo b > extra.txt",
        declared_outputs=[{"path": "a.txt", "role": "r"}],
    )
    assert result.status == "violation"
    assert result.promoted_outputs == ()
    assert not (session.workspace / "a.txt").exists()
    (violation,) = result.violations
    assert violation.target == "extra.txt"
    assert violation.detail == "undeclared write"
    assert len(violation_entries(session, 1)) == 1
    evidence = assert_recorded(session, 1, "violation")
    assert evidence["capability_violations"][0]["target"] == "extra.txt"


async def test_missing_declared_output_blocks_promotion(session: Session) -> None:
    """A declared output the command did not write is a violation; nothing is promoted."""
    result = await sh(
        session,
        "echo a > a.txt",
        declared_outputs=[{"path": "a.txt", "role": "r"}, {"path": "b.txt", "role": "r"}],
    )
    assert result.status == "violation"
    assert result.violations[0].detail == "declared output missing"
    assert not (session.workspace / "a.txt").exists()
    assert_recorded(session, 1, "violation")


async def test_retry_in_green_starts_from_a_clean_sandbox(session: Session) -> None:
    """Each GREEN retry sees an empty sandbox; backoff goes through the injected delay."""
    delays: list[float] = []

    async def fake_delay(seconds: float) -> None:
        delays.append(seconds)

    detector = CountingEntropyDetector(threshold=3)
    result = await sh(
        session,
        "if [ -e out.txt ] || [ -e $TMPDIR/stale ]; then exit 9; fi; "
        "touch out.txt $TMPDIR/stale; exit 1",
        declared_outputs=[{"path": "out.txt", "role": "r"}, {"path": "tmp/*", "role": "scratch"}],
        phase=AgentPhase.GREEN,
        delay=fake_delay,
        entropy_detector=detector,
        options=RetryOptions(max_attempts=3),
    )
    assert [a.exit_code for a in result.attempts] == [1, 1, 1]
    assert delays == [0.5, 1.0]
    assert result.status == "exhausted"
    assert result.reason_code == "RETRY_BUDGET_EXHAUSTED"
    assert detector.statistics().records == 1
    assert_recorded(session, 1, "exhausted")


async def test_turn_aborted_between_attempts_keeps_its_attempts(session: Session) -> None:
    """An error during the retry backoff still records the attempt that already ran."""

    async def failing_delay(seconds: float) -> None:
        raise RuntimeError("backoff broke")

    with pytest.raises(RuntimeError, match=r"^backoff broke$"):
        await sh(session, "exit 1", phase=AgentPhase.GREEN, delay=failing_delay)
    assert_recorded(session, 1, "terminated")
    exec_turn = turn_entries(session.ledgers.session_dir, 1)["exec"][0]
    assert exec_turn["reason_code"] == "TURN_ERROR"
    assert exec_turn["attempt_count"] == 1
    assert exec_turn["attempts"][0]["exit_code"] == 1
    assert exec_turn["argv"] == ["/bin/sh", "-c", "exit 1"]


@pytest.mark.slow  # thousands of nested directories: seconds (not the quick tier)
async def test_deeply_nested_directories_neither_crash_nor_stick(session: Session) -> None:
    """Thousands of nested dirs are enumerated (an undeclared write), then cleared."""
    result = await sh(
        session,
        "i=0; while [ $i -lt 1500 ]; do mkdir d && cd d || exit 3; i=$((i+1)); done; touch f",
    )
    assert result.status == "violation"
    (write,) = result.realized_writes
    assert write.path == "d/" * 1500 + "f"
    again = await sh(session, "ls -A")
    assert again.status == "succeeded"
    assert again.stdout == ""


async def test_capture_setup_failure_closes_the_first_capture(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the stderr capture cannot be created, the stdout one is closed (no fd leak)."""
    created: list[int] = []
    real = os.memfd_create

    def second_fails(name: str, flags: int = 0) -> int:
        if created:
            raise OSError(errno.EMFILE, "Too many open files")
        created.append(real(name, flags))
        return created[-1]

    monkeypatch.setattr(os, "memfd_create", second_fails)
    with pytest.raises(OSError, match=r"^\[Errno 24\] Too many open files$"):
        await sh(session, "true")
    monkeypatch.undo()
    assert_recorded(session, 1, "terminated")
    try:
        target = os.readlink(f"/proc/self/fd/{created[0]}")
    except FileNotFoundError:
        target = ""
    assert "hunter-stdout" not in target


async def test_red_phase_failure_is_not_retried(session: Session) -> None:
    """Outside GREEN/VERIFY a failure ends the turn after one attempt."""
    result = await sh(session, "exit 1", phase=AgentPhase.RED)
    assert result.status == "failed"
    assert len(result.attempts) == 1
    assert result.reason_code == "PHASE_NOT_RETRYABLE"


async def test_turn_numbers_continue_after_resume(runtime: Runtime, install: Installer) -> None:
    """A resumed session continues its turn numbers and keeps both ledgers."""
    install("pkg")
    with runtime.open_session("pkg", work_order_id="WO-1") as first:
        await sh(first, "true")
        sid = first.session_id
    with runtime.resume_session(sid) as again:
        assert again.next_turn_number == 2
        assert again.work_order_id == "WO-1"
        result = await sh(again, "true")
        assert result.turn_number == 2
        evidence = assert_recorded(again, 2, "succeeded")
        assert evidence["work_order_id"] == "WO-1"
        assert again.ledgers.exists_both()


async def test_python_launcher_applies_the_same_confinement(
    root: Path, install: Installer, outside: Path
) -> None:
    """The fallback launcher (no C extension) also drops the uid and applies Landlock."""
    install("pkg")
    with (
        Runtime(root, config=RuntimeConfig(launcher="python")) as runtime,
        runtime.open_session("pkg") as session,
    ):
        result = await sh(session, f"id -u; echo x > {outside}/fallback")
        assert result.attempts[0].launcher == "python"
        assert result.enforcement["launcher"] == "python"
        assert int(result.stdout.split()[0]) == session.uid
        assert not (outside / "fallback").exists()


async def test_background_process_dies_with_the_turn_without_cgroups(
    root: Path, install: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Best-effort without cgroups: what the command leaves running is killed at its exit."""
    monkeypatch.setattr("sandbox.runtime.runtime.detect_layout", CgroupLayout)
    install("pkg")
    with (
        Runtime(root, config=RuntimeConfig(enforcement="best-effort")) as runtime,
        runtime.open_session("pkg") as session,
    ):
        assert runtime.levels["tree_kill"] == "process-group"
        # the background process prints its host pid (its own is 2 in the turn's PID namespace)
        host_pid = "import os, time; print(os.readlink('/proc/self'), flush=True); time.sleep(20)"
        result = await sh(session, f'{{ /usr/bin/python3 -c "{host_pid}" & }} | head -n 1')
        assert result.status == "succeeded", result.stderr
        pid = int(result.stdout)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            with anyio.move_on_after(5) as scope:  # readable once the process has exited
                await anyio.wait_readable(pidfd)
            if scope.cancelled_caught:
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(pidfd)
        assert not scope.cancelled_caught, "the background sleep outlived its turn"


async def test_strict_refuses_when_a_mechanism_is_missing(
    root: Path, install: Installer, world: Path
) -> None:
    """strict raises SandboxUnavailableError (turn recorded); best-effort runs and records it."""
    install("pkg")
    sock_path = world / "open.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock_path))
        sock_path.chmod(0o666)
        with Runtime(root, forbidden_sockets=[sock_path]) as strict:
            session = strict.open_session("pkg")
            with session, pytest.raises(SandboxUnavailableError, match=r"^sandbox enforcement"):
                await sh(session, "true")
            assert_recorded(session, 1, "rejected")
        config = RuntimeConfig(enforcement="best-effort")
        with (
            Runtime(root, config=config, forbidden_sockets=[sock_path]) as lax,
            lax.open_session("pkg") as session,
        ):
            result = await sh(session, "true")
            assert result.status == "succeeded"
            assert result.enforcement["enforcement"] == "best-effort"


async def test_sessions_run_turns_concurrently(runtime: Runtime, install: Installer) -> None:
    """Many sessions run turns at once, each under its own uid, all recorded."""
    install("pkg")
    sessions = [runtime.open_session("pkg") for _ in range(6)]
    results: list[TurnResult] = []

    async def work(session: Session) -> None:
        for _ in range(3):
            results.append(
                await sh(
                    session,
                    "echo $HUNTER_SESSION_ID > id.txt; id -u >> id.txt",
                    declared_outputs=[{"path": "id.txt", "role": "id"}],
                )
            )

    try:
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(work, session)
        assert len({s.uid for s in sessions}) == len(sessions)
        assert [r.status for r in results] == ["succeeded"] * 18
        for session in sessions:
            sid, uid = (session.workspace / "id.txt").read_text().split()
            assert (sid, int(uid)) == (session.session_id, session.uid)
            assert session.next_turn_number == 4
    finally:
        for session in sessions:
            session.close()


async def test_cancelled_turn_is_recorded_and_its_tree_killed(session: Session) -> None:
    """Cancelling a running turn kills its processes and still writes both ledger entries."""
    with anyio.move_on_after(0.5):
        await sh(session, "sleep 30 & sleep 30")
    assert_recorded(session, 1, "terminated")
    exec_turn = turn_entries(session.ledgers.session_dir, 1)["exec"][0]
    assert exec_turn["reason_code"] == "TURN_CANCELLED"
    assert isinstance(session.area, SessionArea)
    cgroup = session.area.cgroup
    assert cgroup is not None
    assert cgroup.members() == []


def test_run_as_root_is_refused() -> None:
    """A configuration that would run turns as root is rejected."""
    with pytest.raises(ValueError, match=r"^run_as_uid must be an unprivileged uid"):
        RuntimeConfig(run_as_uid=0)


def test_both_ledgers_exist_on_open(session: Session) -> None:
    """Opening a session creates both ledgers and the sandbox dirs (FR-RT-018, FR-RT-012)."""
    assert session.ledgers.exists_both()
    for name in ("exec", "evidence"):
        (opened,) = read_ledger(session.ledgers.session_dir / "ledger" / f"{name}.jsonl")
        assert opened["kind"] == "session_opened"
    for area in (session.tmp_dir, session.output_dir):
        st = area.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (session.uid, 0o700)


async def test_turn_result_to_dict_is_json(session: Session) -> None:
    """TurnResult.to_dict is plain JSON data."""
    result = await sh(session, "echo hi")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["status"] == "succeeded"
    assert data["attempts"][0]["stdout"] == "hi\n"


def test_failed_session_setup_releases_uid_and_ledgers(
    runtime: Runtime, install: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose sandbox dirs cannot be prepared returns its uid and closes its ledgers."""
    install("pkg")

    def broken(self: SessionArea) -> None:
        raise OSError(28, "No space left on device")

    sid = new_session_id()
    monkeypatch.setattr(SessionArea, "prepare", broken)
    with pytest.raises(OSError, match=r"^\[Errno 28\] No space left on device$"):
        runtime.open_session("pkg", session_id=sid)
    assert runtime._uids_in_use == set()
    monkeypatch.undo()
    with runtime.resume_session(sid) as session:  # the ledgers' locks were released
        assert session.next_turn_number == 1
