"""Landlock's denials, read from the kernel's audit records (Linux >= 6.15, Landlock ABI 7).

Landlock blocks a turn's read, write or execution outside its grants with ``EACCES`` and tells
nobody. With the kernel's audit on, each denial is also an ``AUDIT_LANDLOCK_ACCESS`` record
(type 1423: the domain that denied, the blocked right, the path), and the first denial of a
domain is followed by an ``AUDIT_LANDLOCK_DOMAIN`` record (type 1424, ``status=allocated``) that
names the process that created the domain. The launcher creates one domain per attempt, in the
process the supervisor spawned, with ``LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`` (denials after
its ``execve`` are logged; they are not by default). So: domain -> creating pid -> the attempt.

`KernelAudit` joins the audit read-log multicast group (``CAP_AUDIT_READ``) and keeps no task of
its own: records wait in the socket (a large receive buffer) and are read when an attempt ends.
The attempt then sends a user record (``AUDIT_USER``, ``CAP_AUDIT_WRITE``) as a *barrier*: the
kernel's audit queue is first in, first out, so when the barrier comes back every denial of the
attempt (made before its processes died) has been read. Nothing here decides: the attempt turns
each `LandlockDenial` into a capability violation on the evidence record.

When audit is off, ``mode="enable"`` turns it on (``CAP_AUDIT_CONTROL``, logged); otherwise, or
without the capabilities, or in a container (audit answers only the initial namespaces),
`KernelAudit.open` says why and the enforcement level reads ``unrecorded``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import socket
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final, Literal

import anyio
import structlog

from sandbox.confine.seccomp import KernelDenial

__all__ = [
    "AUDIT_MECHANISM",
    "AuditMode",
    "AuditRecord",
    "DenialWatch",
    "KernelAudit",
    "LandlockDenial",
    "as_kernel_denial",
    "parse_fields",
    "parse_record",
]

_log = structlog.get_logger("sandbox.confine.audit")

#: How an evidence entry names the mechanism that reported a Landlock denial.
AUDIT_MECHANISM: Final = "landlock-audit"

AuditMode = Literal["enable", "auto", "off"]

_NETLINK_AUDIT: Final = 9
_AUDIT_NLGRP_READLOG: Final = 1
_AUDIT_GET: Final = 1000
_AUDIT_SET: Final = 1001
_AUDIT_USER: Final = 1005
_AUDIT_LANDLOCK_ACCESS: Final = 1423
_AUDIT_LANDLOCK_DOMAIN: Final = 1424
_AUDIT_STATUS_ENABLED: Final = 1
_NLMSG_ERROR: Final = 2
_NLM_F_REQUEST: Final = 1
_NLM_F_ACK: Final = 4
_HEADER: Final = struct.Struct("=LHHLL")
_RCVBUF: Final = 8 << 20
#: Domains whose records wait for their ``allocated`` record, and foreign domains remembered.
_MAX_DOMAINS: Final = 4096
#: Denials kept per attempt (a turn that probes a million files is recorded, not hoarded).
MAX_DENIALS: Final = 256
#: Fields whose value the kernel hex-encodes when it holds a space, a quote or a control byte.
_UNTRUSTED: Final = frozenset({"path", "exe", "comm", "name", "ocomm", "dev"})


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit record: its type, event serial and ``key=value`` fields."""

    type: int
    serial: int
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class LandlockDenial:
    """One access a turn's Landlock domain blocked: the rights (``fs.read_file`` ...) and what."""

    blockers: tuple[str, ...]
    target: str
    serial: int


def _unhex(value: str) -> str:
    if len(value) % 2 or not value:
        return value
    try:
        return bytes.fromhex(value).decode("utf-8", "replace")
    except ValueError:
        return value


def parse_fields(text: str) -> dict[str, str]:
    """The ``key=value`` fields of a record's text (quoted values unquoted, hex decoded)."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] == " ":
            i += 1
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq]
        i = eq + 1
        if i < n and text[i] in "\"'":
            end = text.find(text[i], i + 1)
            end = n if end < 0 else end
            value = text[i + 1 : end]
            i = end + 1
        else:
            end = text.find(" ", i)
            end = n if end < 0 else end
            value = text[i:end]
            if key in _UNTRUSTED and value != "(null)":
                value = _unhex(value)
            i = end
        if key and " " not in key:
            out[key] = value
    return out


def parse_record(kind: int, payload: bytes) -> AuditRecord | None:
    """An audit record from a multicast message's payload; None if it is not one."""
    text = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
    if not text.startswith("audit(") or "): " not in text:
        return None
    stamp, _, rest = text.partition("): ")
    _, _, serial = stamp.partition(":")
    if not serial.isdecimal() or len(serial) > 20:
        return None
    return AuditRecord(kind, int(serial), parse_fields(rest))


@dataclass(slots=True)
class DenialWatch:
    """The Landlock denials of the domain one spawned process created."""

    pid: int
    denials: list[LandlockDenial] = field(default_factory=list)
    dropped: int = 0

    def add(self, denial: LandlockDenial) -> None:
        if len(self.denials) < MAX_DENIALS:
            self.denials.append(denial)
        else:
            self.dropped += 1


class KernelAudit:
    """The read end of the kernel audit's log multicast group, for Landlock denials.

    Built by `open`; `watch` a spawned pid right after the spawn (before anything awaits),
    `barrier` when its processes are gone, then `unwatch`. Close with `close`.
    """

    def __init__(self, reader: socket.socket, writer: socket.socket) -> None:
        self._reader = reader
        self._writer = writer
        self._nonce = secrets.token_hex(6)
        self._tokens = itertools.count(1)
        self._seen_barrier = 0
        self._watches: dict[int, DenialWatch] = {}
        self._domains: dict[str, DenialWatch] = {}
        self._pending: OrderedDict[str, list[LandlockDenial]] = OrderedDict()
        self._foreign: OrderedDict[str, None] = OrderedDict()
        self._lock = anyio.Lock()
        #: times the socket's buffer overflowed (records lost: ENOBUFS)
        self.overflows = 0
        self.records = 0

    # -- set-up ---------------------------------------------------------------------------

    @classmethod
    def open(cls, mode: AuditMode) -> KernelAudit | str:
        """A reader, or why Landlock denials cannot be recorded here."""
        if mode == "off":
            return "sandbox.kernel_audit is off"
        try:
            reader = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_AUDIT)
        except OSError as exc:
            return f"no audit netlink socket ({exc.strerror})"
        writer: socket.socket | None = None
        try:
            writer = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_AUDIT)
            writer.bind((0, 0))
            if not _status_enabled(writer):
                _enable(writer, mode)
            with contextlib.suppress(OSError):  # needs CAP_NET_ADMIN; SO_RCVBUF is the fallback
                reader.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)  # SO_RCVBUFFORCE
            if reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < _RCVBUF:
                reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            try:
                reader.bind((0, 1 << (_AUDIT_NLGRP_READLOG - 1)))
            except OSError as exc:
                raise _Unavailable(
                    f"cannot join the audit log group ({exc.strerror}: needs CAP_AUDIT_READ)"
                ) from exc
            reader.setblocking(False)
            audit = cls(reader, writer)
            audit._send_barrier(0)  # CAP_AUDIT_WRITE: refused here rather than at a turn's end
            return audit
        except _Unavailable as exc:
            reader.close()
            if writer is not None:
                writer.close()
            return str(exc)
        except OSError as exc:
            reader.close()
            if writer is not None:
                writer.close()
            return f"kernel audit unusable ({exc.strerror or exc})"

    def close(self) -> None:
        self._reader.close()
        self._writer.close()

    # -- watching attempts ----------------------------------------------------------------

    def watch(self, pid: int) -> DenialWatch:
        """Collect the denials of the domain *pid* creates (call right after spawning it)."""
        watch = DenialWatch(pid)
        self._watches[pid] = watch
        return watch

    def unwatch(self, watch: DenialWatch) -> None:
        if self._watches.get(watch.pid) is watch:
            del self._watches[watch.pid]
        for domain in [d for d, w in self._domains.items() if w is watch]:
            del self._domains[domain]

    async def barrier(self, timeout_s: float = 1.0) -> bool:
        """Read every record the kernel queued before now; False if that failed or took too
        long (what was read is kept: a turn is never failed by its record keeping)."""
        try:
            return await self._barrier(timeout_s)
        except OSError as exc:
            _log.warning("kernel_audit_barrier_failed", error=exc.strerror or str(exc))
            return False

    async def _barrier(self, timeout_s: float) -> bool:
        token = next(self._tokens)
        try:
            self._send_barrier(token)
        except OSError as exc:
            _log.warning("kernel_audit_barrier_failed", error=exc.strerror or str(exc))
            self.drain()
            return False
        with anyio.move_on_after(timeout_s):
            async with self._lock:
                while self._seen_barrier < token:
                    self.drain()
                    if self._seen_barrier >= token:
                        break
                    await anyio.wait_readable(self._reader)
                return True
        self.drain()
        _log.warning("kernel_audit_barrier_timeout", timeout_s=timeout_s)
        return False

    def drain(self) -> int:
        """Read and route every record waiting in the socket; how many."""
        count = 0
        while True:
            try:
                data = self._reader.recv(65536)
            except BlockingIOError:
                return count
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overflows += 1
                    _log.warning("kernel_audit_overflow", overflows=self.overflows)
                    continue
                raise
            if not data:  # a closed socket (never a netlink message): nothing more to read
                return count
            count += 1
            self._route(data)

    # -- internals ------------------------------------------------------------------------

    def _send_barrier(self, token: int) -> None:
        text = f"hunter-barrier {self._nonce} {token}".encode() + b"\0"
        _request(self._writer, _AUDIT_USER, text)  # acknowledged: a refusal raises here

    def _route(self, data: bytes) -> None:
        if len(data) < _HEADER.size:
            return
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data)
        if kind == _AUDIT_USER:
            self._barrier_seen(data[_HEADER.size : length])
            return
        if kind not in (_AUDIT_LANDLOCK_ACCESS, _AUDIT_LANDLOCK_DOMAIN):
            return
        record = parse_record(kind, data[_HEADER.size : length])
        if record is None:
            return
        self.records += 1
        domain = record.fields.get("domain", "")
        if kind == _AUDIT_LANDLOCK_ACCESS:
            self._access(domain, record)
        else:
            self._domain(domain, record)

    def _barrier_seen(self, payload: bytes) -> None:
        text = payload.decode("utf-8", "replace")
        marker = f"hunter-barrier {self._nonce} "
        at = text.find(marker)
        if at < 0:
            return
        digits = text[at + len(marker) :].split("'", 1)[0].split(" ", 1)[0]
        if digits.isdecimal():
            self._seen_barrier = max(self._seen_barrier, int(digits))

    def _access(self, domain: str, record: AuditRecord) -> None:
        blockers = tuple(b for b in record.fields.get("blockers", "").split(",") if b)
        denial = LandlockDenial(blockers, _target(record.fields), record.serial)
        watch = self._domains.get(domain)
        if watch is not None:
            watch.add(denial)
        elif domain not in self._foreign:
            self._pending.setdefault(domain, []).append(denial)
            self._pending.move_to_end(domain)
            while len(self._pending) > _MAX_DOMAINS:
                self._pending.popitem(last=False)

    def _domain(self, domain: str, record: AuditRecord) -> None:
        status = record.fields.get("status")
        if status == "deallocated":
            self._domains.pop(domain, None)
            self._foreign.pop(domain, None)
            self._pending.pop(domain, None)
            return
        if status != "allocated":
            return
        pid = record.fields.get("pid", "")
        watch = self._watches.get(int(pid)) if pid.isdecimal() and len(pid) < 12 else None
        held = self._pending.pop(domain, [])
        if watch is None:
            self._foreign[domain] = None
            while len(self._foreign) > _MAX_DOMAINS:
                self._foreign.popitem(last=False)
            return
        self._domains[domain] = watch
        for denial in held:
            watch.add(denial)


#: Landlock's name of a blocked right -> (operation, the manifest capability that would grant it)
_BLOCKERS: Final = {
    "fs.execute": ("execute", "capabilities.execute"),
    "fs.read_file": ("read", "capabilities.read"),
    "fs.read_dir": ("read", "capabilities.read"),
    "net.bind_tcp": ("bind", "capabilities.network"),
    "net.connect_tcp": ("connect", "capabilities.network"),
    "scope.abstract_unix_socket": ("connect", "capabilities.unix_sockets"),
    "scope.signal": ("signal", "capabilities.forbidden"),
}


def as_kernel_denial(denial: LandlockDenial, pid: int) -> KernelDenial:
    """The denial as the attempt records every kernel denial (every other ``fs.*`` right, a
    write, truncate, make, remove, rename or device ioctl, is a write)."""
    first = denial.blockers[0] if denial.blockers else "fs.write_file"
    operation, capability = _BLOCKERS.get(first, ("write", "capabilities.write"))
    return KernelDenial(
        operation=operation,
        target=denial.target,
        capability=capability,
        pid=pid,
        errno=errno.EACCES,
        mechanism=f"{AUDIT_MECHANISM} ({','.join(denial.blockers) or 'unnamed right'})",
    )


class _Unavailable(Exception):
    pass


def _target(fields: dict[str, str]) -> str:
    """What was denied, as the record names it (a path, an address, a signalled process)."""
    if "path" in fields:
        return fields["path"]
    if "daddr" in fields or "dest" in fields:
        return f"{fields.get('daddr', '')}:{fields.get('dest', '')}"
    if "opid" in fields:
        return f"pid {fields['opid']} ({fields.get('ocomm', '')})"
    if "dev" in fields and "ino" in fields:
        return f"inode {fields['ino']} on {fields['dev']}"
    return "(unnamed)"


def _request(sock: socket.socket, kind: int, payload: bytes = b"") -> bytes:
    """Send one request and return the reply's payload (the ACK of a SET is consumed)."""
    flags = _NLM_F_REQUEST | _NLM_F_ACK
    sock.send(_HEADER.pack(_HEADER.size + len(payload), kind, flags, 1, 0) + payload)
    while True:
        data = sock.recv(65536)
        length, rtype, _f, _s, _p = _HEADER.unpack_from(data)
        body = data[_HEADER.size : length]
        if rtype == _NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            if code:
                raise OSError(-code, os.strerror(-code))
            if kind != _AUDIT_GET:
                return b""
            continue
        if rtype == kind:
            return body


def _status_enabled(sock: socket.socket) -> bool:
    body = _request(sock, _AUDIT_GET)
    _mask, enabled = struct.unpack_from("=LL", body)
    return bool(enabled)


def _enable(sock: socket.socket, mode: AuditMode) -> None:
    """Turn the kernel's audit on (mode ``enable``), or say why denials go unrecorded."""
    if mode != "enable":
        raise _Unavailable(
            "the kernel's audit is off (enable it with `auditctl -e 1`, boot with "
            'audit=1, or set sandbox.kernel_audit = "enable")'
        )
    payload = struct.pack("=11L", _AUDIT_STATUS_ENABLED, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    try:
        _request(sock, _AUDIT_SET, payload)
    except OSError as exc:
        raise _Unavailable(
            f"the kernel's audit is off and cannot be turned on here ({exc.strerror}: needs "
            "CAP_AUDIT_CONTROL; enable it with `auditctl -e 1` or boot with audit=1)"
        ) from exc
    _log.warning(
        "kernel_audit_enabled",
        reason="the kernel's audit was off; turned on to record Landlock denials "
        '(sandbox.kernel_audit = "auto" leaves it off)',
    )
