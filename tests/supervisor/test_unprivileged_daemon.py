"""The privilege-separated deployment, end to end: `hunter serve` as an unprivileged user with
no capability at all, `hunter sandbox-helper` as root, process turns submitted on control.sock.

What an operator checks: the daemon's process has uid 4242 and CapEff 0; turns still run as
per-session sandbox uids under Landlock, namespaces and cgroups (the helper's levels); the
promoted output belongs to the daemon's user; a read outside the grants is a violation on the
daemon's evidence ledger; ledgers verify.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import verify_root
from supervisor.cli.daemon_commands import format_status
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root
from supervisor.errors import ControlClientError
from tests.helper_process import HelperProcess
from tests.sandbox.conftest import sandbox_unavailable_reason
from tests.storms.crash_checks import check_turn_entries, read_turn_entries
from tests.unprivileged import as_unprivileged

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason())
    ),
]

DAEMON_UID = 4242


@pytest.fixture
def world() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-unpriv-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def helper(world: Path) -> Iterator[HelperProcess]:
    hroot = world / "helper"
    hroot.mkdir(mode=0o711)
    process = HelperProcess(hroot, world / "helper.sock", (DAEMON_UID,), world / "helper.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
async def stack(world: Path, helper: HelperProcess) -> AsyncIterator[DemoStack]:
    root = world / "d"
    config = prepare_root(root, fresh=True)
    text = config.read_text().replace(
        "[sandbox]\n", f'[sandbox]\nhelper_socket = "{helper.socket_path}"\n'
    )
    # three helper kills may each catch the same turn's attempt: room for a fourth
    text = text.replace("max_attempts = 3\n", "max_attempts = 5\n")
    config.write_text(text)
    for path in (root, *root.rglob("*")):
        os.lchown(path, DAEMON_UID, DAEMON_UID)
    s = DemoStack(
        root=root,
        config_path=config,
        daemon_wrapper=partial(as_unprivileged, DAEMON_UID, DAEMON_UID),
    )
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


async def _turn(client: ControlClient, sid: str, argv: list[str], out: list[str]) -> dict[str, Any]:
    submitted = await client.call(
        "turn.submit", session_id=sid, kind="process", argv=argv, declared_outputs=out
    )
    waited = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(waited["turn"])


async def test_an_unprivileged_daemon_runs_sandboxed_turns_through_the_helper(
    stack: DemoStack, helper: HelperProcess, world: Path
) -> None:
    assert stack.daemon is not None
    status = _status(stack.daemon.pid)
    assert status["Uid"].split()[:2] == [str(DAEMON_UID)] * 2
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0000000000000000"
    secret = world / "secret.txt"
    secret.write_text("s")
    secret.chmod(0o644)
    async with ControlClient(stack.control_socket) as client:
        sandbox = (await client.call("status"))["sandbox"]
        assert sandbox["helper_socket"] == str(helper.socket_path)
        assert (sandbox["levels"]["helper"], sandbox["missing"]) == ("separate", {})
        opened = await client.call("session.open", package_id="demo")
        sid = str(opened["session_id"])
        ok = await _turn(
            client, sid, ["sh", "-c", 'id -u > "$HUNTER_OUTPUT_DIR/uid.txt"'], ["uid.txt"]
        )
        denied = await _turn(client, sid, ["cat", str(secret)], [])
    assert ok["state"] == "succeeded", ok["result"]
    promoted = stack.root / "workspace" / sid / "uid.txt"
    st = promoted.stat()
    assert (st.st_uid, st.st_gid) == (DAEMON_UID, DAEMON_UID)
    turn_uid = int(promoted.read_text())
    assert turn_uid not in (0, DAEMON_UID)
    levels = ok["result"]["enforcement"]
    assert (levels["uid_drop"], levels["network"], levels["helper"]) == (
        "per-session",
        "netns",
        "separate",
    )
    assert denied["state"] == "violation", denied["result"]
    (violation,) = denied["result"]["violations"]
    assert violation["target"] == str(secret)
    assert "landlock-audit" in violation["detail"]
    # the helper made the areas under its own root; the daemon's root has none
    assert not (stack.root / "tmp").exists()
    assert "helper_area_opened" in helper.log.read_text()


async def test_helper_killed_repeatedly_under_load_loses_no_turn_and_records_none_twice(
    stack: DemoStack, helper: HelperProcess
) -> None:
    """SIGKILL of the root helper three times while 24 process turns run through the
    unprivileged daemon (restarted each time, as systemd would): attempts in flight become
    CRASH and are retried, every turn succeeds, each has exactly one final entry in each
    ledger, and no process of a sandbox uid is left."""
    script = 'sleep 0.3; echo "$HUNTER_TURN_NUMBER" > "$HUNTER_OUTPUT_DIR/out.txt"'
    async with ControlClient(stack.control_socket) as client:
        sids = [str((await client.call("session.open", package_id="demo"))["session_id"])]
        sids += [str((await client.call("session.open", package_id="demo"))["session_id"])]
        sids += [str((await client.call("session.open", package_id="demo"))["session_id"])]
        ids = []
        for n in range(24):
            submitted = await client.call(
                "turn.submit",
                session_id=sids[n % 3],
                kind="process",
                argv=["sh", "-c", script],
                declared_outputs=["out.txt"],
            )
            ids.append(int(submitted["turn"]["turn_id"]))
        for _ in range(3):
            await anyio.sleep(0.6)
            helper.stop(signal.SIGKILL)
            await anyio.sleep(0.2)  # turns that start now wait for the helper to listen
            await anyio.to_thread.run_sync(helper.restart)
        turns = []
        for turn_id in ids:
            waited = await client.call("turn.wait", turn_id=turn_id, timeout_s=60)
            turns.append(dict(waited["turn"]))
    assert [t["state"] for t in turns] == ["succeeded"] * 24, [
        (t["turn_id"], t["state"], t.get("reason_code")) for t in turns if t["state"] != "succeeded"
    ]
    faults = [a.get("fault_type") for t in turns for a in t["attempts"]]
    assert faults.count("CRASH") >= 1, "no attempt was in flight at a kill"
    problems: list[str] = []
    for sid in sids:
        (session_dir,) = stack.root.glob(f"planes/*/sessions/{sid}")
        by_number, _ = read_turn_entries(session_dir, problems)
        duplicates, missing = check_turn_entries(
            [t for t in turns if t["session_id"] == sid], by_number
        )
        assert (duplicates, missing) == ([], [])
    assert problems == []
    # the sandbox uids of these sessions (from every helper run's log): none has a process
    uids = {
        int(json.loads(line)["uid"])
        for line in helper.log.read_text().splitlines()
        if '"helper_area_opened"' in line
    }
    assert uids
    # A killed helper's turn processes are reparented to the nearest child subreaper: systemd
    # under the units, and here this test process when an earlier test's in-process runtime
    # made it one (`Runtime` does). The next helper kills them; their parent reaps them, so
    # this test does, as systemd would. One that stays is a leak.
    deadline = anyio.current_time() + 5
    while True:
        leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) in uids]
        for pid in leftovers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(pid), os.WNOHANG)  # noqa: ASYNC222 (WNOHANG: never blocks)
        if not leftovers or anyio.current_time() > deadline:
            break
        await anyio.sleep(0.1)
    assert leftovers == [], [_status_line(pid) for pid in leftovers]


def _status_line(pid: str) -> str:
    try:
        fields = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":\t" in line
        )
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError as exc:
        return f"{pid}: {exc}"
    return (
        f"{pid} {fields.get('State')} ppid {fields.get('PPid')} uid {fields.get('Uid')} {cmdline}"
    )


def _uid_of(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return -1


async def test_a_helper_that_is_not_there_yet_is_named_until_it_listens(
    world: Path,
) -> None:
    """The daemon starts before its helper (no socket unit holding connections): `status`
    names what is missing, and opening a session says the helper cannot be reached; once the
    helper listens, sessions open and turns run, and `status` has nothing missing."""
    root = world / "d"
    socket_path = world / "late.sock"
    config = prepare_root(root, fresh=True)
    config.write_text(
        config.read_text().replace("[sandbox]\n", f'[sandbox]\nhelper_socket = "{socket_path}"\n')
    )
    for path in (root, *root.rglob("*")):
        os.lchown(path, DAEMON_UID, DAEMON_UID)
    stack = DemoStack(
        root=root,
        config_path=config,
        daemon_wrapper=partial(as_unprivileged, DAEMON_UID, DAEMON_UID),
    )
    hroot = world / "helper"
    hroot.mkdir(mode=0o711)
    helper = HelperProcess(hroot, socket_path, (DAEMON_UID,), world / "helper.log")
    try:
        await stack.start_daemon()
        async with ControlClient(stack.control_socket) as client:
            status = await client.call("status")
            assert "helper" in status["sandbox"]["missing"]
            text = format_status(status)
            (missing,) = [line for line in text.splitlines() if "SANDBOX MISSING" in line]
            assert missing.startswith("SANDBOX MISSING helper: ")
            assert f"sandbox helper at {socket_path}" in missing
            assert "sandbox: best-effort, confined helper" in text
            with pytest.raises(ControlClientError, match=r"sandbox helper at .*late\.sock"):
                await client.call("session.open", package_id="demo")
            await anyio.to_thread.run_sync(helper.start)
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            ran = await _turn(client, sid, ["true"], [])
            assert ran["state"] == "succeeded", ran["result"]
            assert (await client.call("status"))["sandbox"]["missing"] == {}
    finally:
        await stack.aclose()
        helper.stop()
