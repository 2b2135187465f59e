"""The sandbox helper as a real root process, reached by a daemon-side runtime over its socket.

The daemon's half (`Runtime(..., helper=HelperClient(...))`) keeps the ledgers; the helper
(`hunter sandbox-helper`, a subprocess on its own root) opens the areas, runs the confined
attempts and promotes. These tests run both halves for real: process turns, a Landlock denial
on the record, a run whose connection closes, a helper killed in the middle of a run, a
helper that restarted, and requests an attacker could send.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anyio
import msgspec
import pytest

from ledger import verify_session_dir
from ledger.errors import LedgerClosedError
from sandbox.enumerate import RealizedWrite
from sandbox.helper import wire
from sandbox.helper.remote import HelperClient, HelperError, RemoteArea
from sandbox.policy.attempts import RetryOptions
from sandbox.promote import PromotedOutput
from sandbox.runtime import Runtime, Session
from tests.helper_process import HelperProcess
from tests.sandbox.conftest import SYSTEM_PYTHON
from tests.unprivileged import as_unprivileged

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
#: a uid that is neither root nor allowed
STRANGER = 4243


@pytest.fixture
def helper(world: Path) -> Iterator[HelperProcess]:
    hroot = world / "helper"
    hroot.mkdir(mode=0o711)
    process = HelperProcess(hroot, world / "helper.sock", (4242,), world / "helper.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def runtime(root: Path, helper: HelperProcess) -> Iterator[Runtime]:
    with Runtime(root, helper=HelperClient(helper.socket_path)) as rt:
        yield rt


@pytest.fixture
def session(runtime: Runtime, install: Installer) -> Iterator[Session]:
    install("pkg")
    with runtime.open_session("pkg") as s:
        yield s


def _pids_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except FileNotFoundError:
                continue
    return found


async def test_a_turn_runs_in_the_helper_and_the_daemon_keeps_the_ledgers(
    session: Session, runtime: Runtime, helper: HelperProcess
) -> None:
    """The areas are the helper's, the turn runs as a sandbox uid, the output is promoted,
    and both ledgers (written by the daemon's half only) verify."""
    assert runtime.levels["helper"] == "separate"
    assert runtime.audit is None  # the daemon's half reads no kernel audit log
    assert session.tmp_dir.is_relative_to(helper.root)
    assert session.uid >= 1_000
    result = await session.run_process_turn(
        ["/bin/sh", "-c", 'id -u > "$HUNTER_OUTPUT_DIR/uid.txt"'],
        declared_outputs=["uid.txt"],
    )
    assert result.status == "succeeded", result.to_dict()
    promoted = session.workspace / "uid.txt"
    assert promoted.read_text().strip() == str(session.uid)
    assert result.enforcement["uid_drop"] == "per-session"
    assert [r.ledger_id for r in verify_session_dir(session.ledgers.session_dir)]
    # scratch is emptied when the turn ends (by the helper)
    assert os.listdir(session.output_dir) == []


async def test_a_denied_read_is_a_violation_on_the_daemons_record(
    session: Session, world: Path
) -> None:
    """A read outside the grants, allowed by file modes, is denied by Landlock in the helper,
    reported by the kernel's audit log there, and recorded by the daemon's half."""
    secret = world / "secret.txt"
    secret.write_text("s")
    secret.chmod(0o644)
    result = await session.run_process_turn(
        ["/bin/cat", str(secret)], declared_outputs=[], options=RetryOptions(max_attempts=1)
    )
    assert result.status == "violation", result.to_dict()
    (violation,) = result.violations
    assert (violation.operation, violation.target) == ("read", str(secret))
    assert "landlock-audit" in violation.detail
    entries = [
        line
        for line in (session.ledgers.session_dir / "ledger" / "evidence.jsonl")
        .read_text()
        .splitlines()
        if '"capability_violation"' in line
    ]
    assert len(entries) == 1
    assert str(secret) in entries[0]


async def test_closing_the_connection_kills_the_run(session: Session) -> None:
    """A daemon that gives up on a run (its connection closes) gets the run killed."""
    area = session.area
    assert isinstance(area, RemoteArea)
    await area.confinement()
    with anyio.move_on_after(1.5):
        await area.run_attempt(
            exe="/bin/sleep", argv=["sleep", "60"], declared=(), turn=1, attempt_no=1, timeout_s=60
        )
        pytest.fail("the run returned before it was cancelled")
    deadline = time.monotonic() + 10
    while _pids_of(session.uid) and time.monotonic() < deadline:  # noqa: ASYNC110 (another process)
        await anyio.sleep(0.05)
    assert _pids_of(session.uid) == []


async def test_a_helper_killed_during_a_run_is_a_crash_and_the_retry_succeeds(
    session: Session, helper: HelperProcess
) -> None:
    """SIGKILL of the helper in the middle of an attempt: the attempt is a CRASH (HELPER_LOST),
    the next helper reclaims its processes and reopens the area, the retry succeeds."""
    script = 'sleep 1; echo done > "$HUNTER_OUTPUT_DIR/out.txt"'
    results = []

    async def run() -> None:
        results.append(
            await session.run_process_turn(
                ["/bin/sh", "-c", script],
                declared_outputs=["out.txt"],
                options=RetryOptions(max_attempts=3, base_delay_ms=500, max_delay_ms=500),
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0.4)
        first_uid = session.uid
        assert _pids_of(first_uid), "the first attempt is not running"
        helper.stop(signal.SIGKILL)
        await anyio.to_thread.run_sync(helper.restart)
    (result,) = results
    assert result.status == "succeeded", result.to_dict()
    assert [a.fault_type for a in result.attempts] == ["CRASH", None]
    assert "HELPER_LOST" in result.attempts[0].stderr or result.attempts[0].launcher == "helper"
    assert (session.workspace / "out.txt").read_text() == "done\n"
    assert b"sandbox_leftovers_reclaimed" in helper.log.read_bytes()[helper.offset :]


async def test_a_restarted_helper_reopens_the_area_on_first_use(
    session: Session, helper: HelperProcess
) -> None:
    helper.stop()
    await anyio.to_thread.run_sync(helper.start)
    result = await session.run_process_turn(["/bin/true"], declared_outputs=[])
    assert result.status == "succeeded", result.to_dict()
    assert b"helper_area_opened" in helper.log.read_bytes()[helper.offset :]


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _exchange(path: Path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _failed(reply: bytes) -> wire.Failed:
    decoded = wire.decode_reply(reply[4:])
    assert isinstance(decoded, wire.Failed), decoded
    return decoded


def test_bad_requests_are_refused_and_the_helper_keeps_serving(helper: HelperProcess) -> None:
    sock = helper.socket_path
    enc = msgspec.msgpack.encode
    assert _failed(_exchange(sock, _frame(b"\xc1garbage"))).kind == "bad_request"
    assert _failed(_exchange(sock, struct.pack(">I", wire.MAX_FRAME + 1))).kind == "bad_request"
    assert _failed(_exchange(sock, _frame(enc({"op": "nope"})))).kind == "bad_request"
    session: dict[str, str] = {
        "session_id": "../../etc",
        "package_id": "p",
        "package_dir": "/x",
        "manifest": "MANIFEST",
        "workspace": "/w",
    }
    bad_open = {"op": "open", "session": session}
    assert _failed(_exchange(sock, _frame(enc(bad_open)))).kind == "bad_request"
    # a manifest nested 100,000 deep (an array in an array ...), under a valid session id
    sid = "SES-20260101T000000.000000Z-0123456789abcdef"
    body = enc({"op": "open", "session": {**session, "session_id": sid}})
    deep = b"\x81\xa1a" + b"\x91" * 100_000 + b"\xc0"
    nested = body.replace(enc("MANIFEST"), deep)
    assert _failed(_exchange(sock, _frame(nested))).kind == "bad_request"
    unknown = wire.encode(wire.Empty(session_id="SES-20260101T000000.000000Z-0123456789abcdef"))
    assert _failed(_exchange(sock, unknown)).kind == "unknown_session"
    assert _exchange(sock, b"\x00\x00") == b""  # a cut frame: closed, nothing sent
    welcome = HelperClient(sock).hello()
    assert welcome.version == wire.PROTOCOL_VERSION
    assert welcome.levels["uid_drop"] == "per-session"


async def test_promotion_takes_only_paths_the_helpers_own_run_found(session: Session) -> None:
    """The daemon names outputs by path; a path its last run did not write (or one that
    climbs out of output/<sid>) is refused, and nothing reaches the workspace."""
    area = session.area
    assert isinstance(area, RemoteArea)
    await area.confinement()
    run = await area.run_attempt(
        exe="/bin/sh",
        argv=["sh", "-c", 'echo x > "$HUNTER_OUTPUT_DIR/a.txt"'],
        declared=(),
        turn=1,
        attempt_no=1,
        timeout_s=10,
    )
    (write,) = run.surface.writes
    for path in ("../../../etc/shadow", "b.txt"):
        forged = wire.Promote(
            session_id=session.session_id, paths=(path,), workspace=str(session.workspace)
        )
        reply = await area.client.call(forged)
        assert isinstance(reply, wire.Failed), reply
        assert reply.kind == "promotion", reply
    assert not session.workspace.exists() or os.listdir(session.workspace) == []
    done: list[object] = []
    await area.promote([write], session.workspace, done=done)  # type: ignore[arg-type]
    assert (session.workspace / "a.txt").read_text() == "x\n"
    with pytest.raises(OSError, match="not a file the session's last run wrote"):
        await area.promote([write], session.workspace, done=[])  # promoted once only


def test_a_user_not_allowed_is_refused(helper: HelperProcess) -> None:
    """Only the daemon's uid (and root) may use the helper: SO_PEERCRED, checked first."""
    script = (
        "import socket,struct,sys\n"
        "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "body=bytes([0x81,0xa2])+b'op'+bytes([0xa5])+b'hello'\n"
        "try:\n"
        "    s.sendall(struct.pack('>I',len(body))+body)\n"
        "except BrokenPipeError:\n"  # the helper may refuse (and close) before it is sent
        "    pass\n"
        "sys.stdout.buffer.write(s.recv(65536))\n"
    )
    helper.socket_path.chmod(0o666)  # file modes are not the only guard
    proc = subprocess.run(
        [
            "setpriv",
            f"--reuid={STRANGER}",
            f"--regid={STRANGER}",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-c",
            script,
            str(helper.socket_path),
        ],
        capture_output=True,
        timeout=30,
        check=True,
    )
    failed = _failed(proc.stdout)
    assert failed.kind == "forbidden"
    assert str(STRANGER) in failed.message
    assert "helper_peer_refused" in helper.log.read_text()
    assert HelperClient(helper.socket_path).hello().version == wire.PROTOCOL_VERSION


def test_an_unreachable_helper_refuses_turns_with_the_reason(root: Path, world: Path) -> None:
    with Runtime(root, helper=HelperClient(world / "absent.sock")) as rt:
        assert rt.levels == {"helper": "unreachable"}
        with pytest.raises(Exception, match=r"sandbox helper at .*absent\.sock"):
            rt.require_enforcement()


def test_helper_error_names_the_kind() -> None:
    assert "unknown_session" in str(HelperError("unknown_session", "x"))


async def test_closing_a_session_while_the_helper_is_down_still_closes_its_ledgers(
    session: Session, helper: HelperProcess
) -> None:
    result = await session.run_process_turn(["/bin/true"], declared_outputs=[])
    assert result.status == "succeeded"
    helper.stop()
    session.close()  # logs helper_area_not_closed, raises nothing
    with pytest.raises(LedgerClosedError):
        session.ledgers.exec.append({"kind": "note"})
    verify_session_dir(session.ledgers.session_dir)


async def test_a_starting_daemon_has_the_helper_close_what_its_previous_run_left(
    root: Path, world: Path, install: Installer, helper: HelperProcess
) -> None:
    """A daemon killed with SIGKILL leaves its sessions' areas open in the helper (a session
    taken over by another host would never be reopened here); the next daemon's start closes
    them: processes killed, session disk unmounted, directories removed. Another daemon's
    (another root) areas in the same helper stay."""
    installed = install("pkg")
    other_root = world / "other"
    (other_root / "installed").mkdir(parents=True)
    shutil.copytree(installed, other_root / "installed" / "pkg")
    other = Runtime(other_root, helper=HelperClient(helper.socket_path))
    other_session = other.open_session("pkg")
    first = Runtime(root, helper=HelperClient(helper.socket_path))
    session = first.open_session("pkg")
    area = session.area
    assert isinstance(area, RemoteArea)
    await area.confinement()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            functools.partial(
                area.run_attempt,
                exe="/bin/sleep",
                argv=["sleep", "60"],
                declared=(),
                turn=1,
                attempt_no=1,
                timeout_s=60,
            )
        )
        await anyio.sleep(0.5)
        assert _pids_of(session.uid)
        first.close()  # releases the root lock: as if the daemon died (its session abandoned)
        with Runtime(root, helper=HelperClient(helper.socket_path)):
            resets = [
                json.loads(line)
                for line in helper.log.read_text().splitlines()
                if '"helper_areas_reset"' in line
            ]
            assert [r["closed"] for r in resets] == [0, 0, 1]  # each start; the third finds one
            assert not session.tmp_dir.exists()
            assert _pids_of(session.uid) == []
            assert other_session.tmp_dir.exists()
            result = await other_session.run_process_turn(["/bin/true"], declared_outputs=[])
            assert result.status == "succeeded", result.to_dict()
        tg.cancel_scope.cancel()
    session.close()
    other_session.close()
    other.close()


def test_a_daemon_of_a_uid_not_allowed_is_told_why(helper: HelperProcess) -> None:
    """The daemon's side of a refused connection: the helper's `forbidden` reply is read and
    named, even when the helper closed the connection before the request was sent."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sandbox.helper.remote import HelperClient, HelperError\n"
        "try:\n"
        "    HelperClient(Path(sys.argv[1])).hello()\n"
        "except HelperError as exc:\n"
        "    print(exc)\n"
    )
    helper.socket_path.chmod(0o666)
    repo = Path(__file__).resolve().parents[3]
    for _ in range(5):  # the helper may close before or after the request arrives
        proc = subprocess.run(
            as_unprivileged(
                STRANGER, STRANGER, [sys.executable, "-c", script, str(helper.socket_path)]
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd=repo,
        )
        assert f"forbidden: uid {STRANGER} may not use the sandbox helper" in proc.stdout, proc


async def test_outputs_lost_with_the_helper_before_promotion_make_the_attempt_a_crash(
    session: Session, helper: HelperProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper is killed (SIGKILL) and restarted after the run, before its outputs are
    promoted: they are gone with it. The attempt is a CRASH (CONFINEMENT_LOST) and is run
    again; the second attempt's output is promoted, once."""
    promote = RemoteArea.promote
    kills: list[int] = []

    async def kill_first(
        self: RemoteArea,
        writes: Sequence[RealizedWrite],
        workspace: Path,
        *,
        done: list[PromotedOutput],
    ) -> None:
        if not kills:
            kills.append(1)
            helper.stop(signal.SIGKILL)
            await anyio.to_thread.run_sync(helper.restart)
        await promote(self, writes, workspace, done=done)

    monkeypatch.setattr(RemoteArea, "promote", kill_first)
    result = await session.run_process_turn(
        ["/bin/sh", "-c", 'echo "$$" > "$HUNTER_OUTPUT_DIR/out.txt"'],
        declared_outputs=["out.txt"],
        options=RetryOptions(max_attempts=3, base_delay_ms=10, max_delay_ms=10),
    )
    assert result.status == "succeeded", result.to_dict()
    first, second = result.attempts
    assert (first.fault_type, first.verdict, first.reason_code) == (
        "CRASH",
        "RETRY",
        "RETRY_AFTER_CRASH",
    )
    assert "the outputs were lost before promotion" in first.stderr
    assert "no open area for session" in first.stderr
    assert second.verdict == "SUCCEED"
    assert [p.path for p in result.promoted_outputs] == ["out.txt"]
    assert (session.workspace / "out.txt").exists()
    exec_turns = [
        json.loads(line)
        for line in (session.ledgers.session_dir / "ledger" / "exec.jsonl").read_text().splitlines()
        if '"kind":"turn"' in line
    ]
    assert len(exec_turns) == 1
