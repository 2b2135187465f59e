"""Landlock's denials on the evidence record (seed 004 FR-RT-003/010/011): real turns read, write
and execute outside their grants, the kernel blocks each and reports it through its audit log,
and each block is a capability violation of that turn, with the mechanism that reported it."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from sandbox.confine.audit import KernelAudit
from sandbox.runtime import Runtime, RuntimeConfig, Session, TurnResult

pytestmark = pytest.mark.usefixtures("sandboxed", "system_python")

TIMEOUT_MS = 10_000
Installer = Callable[..., Path]


def _audit_status(enabled: int | None = None) -> int:
    """The kernel audit's ``enabled`` flag; set it first when *enabled* is given."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)
    try:
        sock.bind((0, 0))
        if enabled is not None:
            body = struct.pack("=11L", 1, enabled, *([0] * 9))
            sock.send(struct.pack("=LHHLL", 16 + len(body), 1001, 5, 1, 0) + body)
            sock.recv(65536)  # the ACK
        sock.send(struct.pack("=LHHLL", 16, 1000, 1, 2, 0))
        while True:
            data = sock.recv(65536)
            if struct.unpack_from("=H", data, 4)[0] == 1000:
                return int(struct.unpack_from("=L", data, 20)[0])
    finally:
        sock.close()


@pytest.fixture
def runtime(runtime: Runtime) -> Runtime:
    """The conftest's runtime, where the kernel reports Landlock's denials."""
    if runtime.levels["fs_denials"] != "landlock-audit":
        pytest.skip(f"Landlock denials are not recorded here ({runtime.levels['fs_denials']})")
    return runtime


@pytest.fixture
def outside(outside: Path) -> Path:
    """The conftest's directory outside, with a world-readable file in it."""
    secret = outside / "secret.txt"
    secret.write_text("not yours")
    secret.chmod(0o644)
    return outside


async def sh(session: Session, script: str) -> TurnResult:
    return await session.run_process_turn(
        ["/bin/sh", "-c", script], declared_outputs=[], timeout_ms=TIMEOUT_MS
    )


def evidence_entries(session: Session) -> list[dict[str, Any]]:
    """The ``capability_violation`` entries of the session's evidence ledger."""
    path = session.ledgers.session_dir / "ledger" / "evidence.jsonl"
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [e for e in entries if e.get("kind") == "capability_violation"]


async def test_read_write_and_execute_outside_are_each_a_recorded_violation(
    runtime: Runtime, install: Installer, outside: Path
) -> None:
    """One turn reads, writes and executes outside its grants: three denials, three violations
    in the result and on the evidence ledger, each naming operation, target, capability,
    session, turn, time and Landlock's audit record as the mechanism."""
    install(
        "narrow",
        capabilities={"read": [], "write": ["**"], "execute": ["/bin/sh"], "forbidden": []},
    )
    with runtime.open_session("narrow") as session:
        result = await sh(
            session,
            f"read -r line < {outside}/secret.txt; echo x > {outside}/new; /usr/bin/id; echo done",
        )
        assert result.stdout.strip() == "done"
        assert result.status == "violation"
        assert result.fault_type == "SECURITY_VIOLATION"
        assert result.enforcement["fs_denials"] == "landlock-audit"
        got = sorted((v.operation, v.target, v.capability) for v in result.violations)
        assert got == [
            ("execute", "/usr/bin/id", "capabilities.execute"),
            ("read", f"{outside}/secret.txt", "capabilities.read"),
            ("write", str(outside), "capabilities.write"),
        ]
        entries = evidence_entries(session)
        assert {(e["session_id"], e["turn_number"]) for e in entries} == {
            (session.session_id, result.turn_number)
        }
        recorded = [v for e in entries for v in e["capability_violations"]]
        assert sorted((v["operation"], v["target"]) for v in recorded) == [g[:2] for g in got]
        for v in recorded:
            assert isinstance(v["timestamp_us"], int)
            assert "landlock-audit (fs." in v["detail"]
        assert not (outside / "new").exists()


async def test_a_detached_grandchild_is_still_the_turns(session: Session, outside: Path) -> None:
    """A process that left the turn's session and process group (setsid, double fork) before
    reading outside is still in the turn's Landlock domain: its denial is the turn's."""
    result = await sh(
        session,
        f"(setsid sh -c 'cat {outside}/secret.txt' &); sleep 0.3; echo parent",
    )
    assert "not yours" not in result.stdout
    [violation] = result.violations
    assert (violation.operation, violation.target) == ("read", f"{outside}/secret.txt")


async def test_concurrent_turns_get_only_their_own_denials(
    runtime: Runtime, install: Installer, outside: Path
) -> None:
    """Two sessions run at once, each reading its own file outside: each turn's record holds
    its own denial and never the other's."""
    install("pkg")
    for name in ("a", "b"):
        (outside / name).write_text(name)
        (outside / name).chmod(0o644)
    results: dict[str, TurnResult] = {}
    with runtime.open_session("pkg") as first, runtime.open_session("pkg") as second:

        async def run(sess: Session, name: str) -> None:
            results[name] = await sh(sess, f"sleep 0.1; cat {outside}/{name}; sleep 0.1")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, first, "a")
            tg.start_soon(run, second, "b")
    for name in ("a", "b"):
        assert [v.target for v in results[name].violations] == [f"{outside}/{name}"]


async def test_reading_a_mount_table_is_blocked_but_not_a_violation(session: Session) -> None:
    """coreutils read /proc/self/mounts at start; /proc/self cannot be granted ahead of time.
    The read is still blocked, but it is not a capability violation."""
    result = await sh(session, "cat /proc/self/mounts")
    assert result.status == "failed"
    assert result.violations == ()
    assert "Permission denied" in result.stderr


async def test_a_turn_that_stays_inside_has_no_violation(session: Session) -> None:
    """Ordinary programs (a shell, coreutils, Python) start without any recorded denial."""
    result = await sh(session, "ls /usr > /dev/null; date > /dev/null; python3 -c 'print(1)'")
    assert result.violations == (), result.violations
    assert result.stdout.strip() == "1"


def test_audit_off_is_reported_or_turned_on(root: Path) -> None:
    """With the kernel's audit off, ``auto`` records nothing and says why; ``enable`` turns it
    on and logs that it did."""
    before = _audit_status()
    try:
        _audit_status(0)
        with capture_logs() as logs, Runtime(root, config=RuntimeConfig(kernel_audit="auto")) as rt:
            assert rt.levels["fs_denials"] == "unrecorded"
            assert rt.audit is None
        [warning] = [e for e in logs if e["event"] == "kernel_denials_unrecorded"]
        assert "auditctl -e 1" in warning["reason"]
        assert _audit_status() == 0
        with (
            capture_logs() as logs,
            Runtime(root, config=RuntimeConfig(kernel_audit="enable")) as rt,
        ):
            assert rt.levels["fs_denials"] == "landlock-audit"
        assert any(e["event"] == "kernel_audit_enabled" for e in logs)
        assert _audit_status() == 1
    finally:
        with contextlib.suppress(OSError):
            _audit_status(before)


def test_off_means_off(root: Path) -> None:
    """``kernel_audit = "off"``: nothing is opened, the level says unrecorded, no warning."""
    with capture_logs() as logs, Runtime(root, config=RuntimeConfig(kernel_audit="off")) as rt:
        assert rt.audit is None
        assert rt.landlock_flags == 0
        assert rt.levels["fs_denials"] == "unrecorded"
    assert not [e for e in logs if e["event"] == "kernel_denials_unrecorded"]


def test_open_reports_a_refusal_as_a_reason() -> None:
    """Opened as it is by the runtime, the reader is usable or says why not (never raises)."""
    found = KernelAudit.open("auto")
    if isinstance(found, KernelAudit):
        found.close()
    else:
        assert found
