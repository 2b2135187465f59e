"""The audit record parser and router on records as the kernel writes them (Linux 6.18)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from sandbox.confine.audit import KernelAudit, as_kernel_denial, parse_fields, parse_record
from sandbox.policy.denials import is_violation


def _message(kind: int, text: str) -> bytes:
    payload = text.encode()
    return struct.pack("=LHHLL", 16 + len(payload), kind, 0, 0, 0) + payload


@pytest.fixture
def audit() -> Iterator[KernelAudit]:
    left, right = socket.socketpair()
    try:
        yield KernelAudit(left, right)
    finally:
        left.close()
        right.close()


def test_quoted_and_hex_encoded_values() -> None:
    """Paths with a space or a quote come hex-encoded and unquoted; others quoted."""
    text = 'domain=1f6ad610c blockers=fs.read_file path="/etc/hostname" dev="vda" ino=612'
    assert parse_fields(text) == {
        "domain": "1f6ad610c",
        "blockers": "fs.read_file",
        "path": "/etc/hostname",
        "dev": "vda",
        "ino": "612",
    }
    hexed = parse_fields("path=" + b"/tmp/a b".hex() + " ino=1")
    assert hexed == {"path": "/tmp/a b", "ino": "1"}


def test_record_header() -> None:
    record = parse_record(1423, b"audit(1795671460.129:3): domain=1f blockers=fs.execute\0")
    assert record is not None
    assert (record.type, record.serial, record.fields["blockers"]) == (1423, 3, "fs.execute")
    assert parse_record(1423, b"not an audit record") is None
    assert parse_record(1423, b"audit(1.2:x): a=b") is None


def test_denials_wait_for_their_domain_and_go_only_to_its_creator(audit: KernelAudit) -> None:
    """The access record comes before the ``allocated`` record naming the creating pid: it is
    held, then given to the watch of that pid; another pid's domain is dropped."""
    mine = audit.watch(2035)
    audit._route(_message(1423, 'audit(1.1:3): domain=aa blockers=fs.read_file path="/x"'))
    audit._route(_message(1424, "audit(1.1:3): domain=aa status=allocated mode=enforcing pid=2035"))
    audit._route(_message(1423, 'audit(1.1:4): domain=bb blockers=fs.write_file path="/y"'))
    audit._route(_message(1424, "audit(1.1:4): domain=bb status=allocated pid=999"))
    audit._route(_message(1423, 'audit(1.1:5): domain=aa blockers=fs.execute path="/usr/bin/id"'))
    assert [(d.blockers, d.target) for d in mine.denials] == [
        (("fs.read_file",), "/x"),
        (("fs.execute",), "/usr/bin/id"),
    ]
    audit._route(_message(1424, "audit(1.1:6): domain=aa status=deallocated denials=2"))
    audit._route(_message(1423, 'audit(1.1:7): domain=aa blockers=fs.read_file path="/z"'))
    assert len(mine.denials) == 2


def test_a_barrier_record_of_another_daemon_is_not_ours(audit: KernelAudit) -> None:
    audit._route(_message(1005, "pid=1 uid=0 msg='hunter-barrier 0123456789ab 7'"))
    assert audit._seen_barrier == 0


@pytest.mark.parametrize(
    ("blockers", "target", "operation", "capability"),
    [
        (("fs.read_file",), "/etc/shadow", "read", "capabilities.read"),
        (("fs.read_dir",), "/root", "read", "capabilities.read"),
        (("fs.execute",), "/usr/bin/id", "execute", "capabilities.execute"),
        (("fs.make_reg",), "/etc", "write", "capabilities.write"),
        (("fs.write_file", "fs.read_file"), "/dev/sda", "write", "capabilities.write"),
        (("net.connect_tcp",), "127.0.0.1:80", "connect", "capabilities.network"),
        (("scope.abstract_unix_socket",), "@bus", "connect", "capabilities.unix_sockets"),
    ],
)
def test_each_blocked_right_names_its_capability(
    blockers: tuple[str, ...], target: str, operation: str, capability: str
) -> None:
    from sandbox.confine.audit import LandlockDenial

    denial = as_kernel_denial(LandlockDenial(blockers, target, 1), 77)
    assert (denial.operation, denial.target, denial.capability) == (operation, target, capability)
    assert "landlock-audit" in denial.detail


@pytest.mark.parametrize(
    ("blockers", "target", "violation"),
    [
        (("fs.read_file",), "/proc/123/mounts", False),
        (("fs.read_file",), "/proc/self/mountinfo", False),
        (("fs.read_file",), "/proc/123/task/124/mounts", False),
        (("fs.write_file",), "/proc/123/mounts", True),
        (("fs.read_file",), "/proc/123/environ", True),
        (("fs.read_file",), "/proc/123/mounts/../environ", True),
        (("fs.read_file",), "/etc/shadow", True),
        ((), "/proc/1/mounts", True),
    ],
)
def test_only_a_read_of_a_mount_table_is_left_out(
    blockers: tuple[str, ...], target: str, violation: bool
) -> None:
    assert is_violation(blockers, target) is violation


async def test_a_failing_barrier_is_reported_not_raised(audit: KernelAudit) -> None:
    """The kernel refuses the barrier (here: its socket is gone): the attempt is not failed by
    its record keeping; the barrier says False and the log says why."""
    audit._reader.setblocking(False)
    audit._writer.close()
    with capture_logs() as logs:
        assert await audit.barrier(0.1) is False
    assert [e["event"] for e in logs] == ["kernel_audit_barrier_failed"]
