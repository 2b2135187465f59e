"""The daemon's side of the sandbox helper: `HelperClient` and its `RemoteArea`s.

A `RemoteArea` is a session's `ConfinedArea` (sandbox/runtime/confined_area.py) whose work
the root helper does (server.py). A session's requests go one after the other on its own
connection (channel.py): a request in flight is cancelled by closing it (the helper then kills
the confined run), and requests of different sessions never wait for each other. A helper that
restarted has lost its areas: the first request that finds its session unknown opens it again
and is sent once more.
"""

from __future__ import annotations

import contextlib
import errno as errno_
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio
import structlog

from sandbox.enumerate import RealizedWrite, WriteSurface
from sandbox.errors import (
    CapabilityViolation,
    ConfinementLostError,
    HelperError,
    SandboxUnavailableError,
)
from sandbox.helper import wire
from sandbox.helper.channel import Channel
from sandbox.packages import Package
from sandbox.policy.declarations import DeclaredOutput
from sandbox.promote import PromotedOutput, PromotionError
from sandbox.runs import ConfinedRun, crashed_run

__all__ = ["HelperClient", "HelperError", "HelperUnavailableError", "RemoteArea", "manifest_wire"]

_log = structlog.get_logger("sandbox.helper.remote")

#: Reason of an attempt whose helper went away (a CRASH fault: retried).
HELPER_LOST: Final = "HELPER_LOST"
#: How long a request that is not a confined run may take (opening an area mounts a disk).
_CALL_TIMEOUT_S: Final = 60.0
#: A confined run's reply may come this long after its deadline (kill grace, enumeration).
_RUN_SLACK_S: Final = 120.0


class HelperUnavailableError(ConfinementLostError):
    """The helper's socket could not be reached, or it closed the connection."""


def manifest_wire(package: Package) -> dict[str, object]:
    """The package's manifest as `sandbox.packages.parse_manifest` reads it again."""
    data = package.manifest.to_dict()
    if data.get("id") is None:
        data.pop("id", None)
    limits = data.get("limits")
    if isinstance(limits, dict):
        data["limits"] = {k: v for k, v in limits.items() if v is not None}
    return data


def _raise_failed(reply: wire.Failed) -> None:
    if reply.kind == "promotion":
        raise PromotionError(reply.message)
    if reply.kind == "os":
        raise OSError(reply.errno or errno_.EIO, reply.message)
    if reply.kind == "unavailable":
        raise SandboxUnavailableError(mechanisms={"helper": reply.message})
    raise HelperError(reply.kind, reply.message)


class HelperClient:
    """Requests to the sandbox helper listening on *path*."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def call_blocking(
        self, request: wire.Request, *, timeout_s: float = _CALL_TIMEOUT_S
    ) -> wire.Reply:
        """Send *request* and wait for its reply (blocking: a worker thread, or start-up)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(timeout_s)
                sock.connect(str(self.path))
                with contextlib.suppress(BrokenPipeError):  # refused before reading: why?
                    sock.sendall(wire.encode(request))
                header = _recv_exactly(sock, wire.HEADER_SIZE)
                body = _recv_exactly(sock, wire.frame_length(header))
        except OSError as exc:
            raise HelperUnavailableError(
                exc.errno or errno_.EIO, f"sandbox helper at {self.path}: {exc.strerror or exc}"
            ) from None
        return wire.decode_reply(body)

    async def call(
        self, request: wire.Request, *, timeout_s: float = _CALL_TIMEOUT_S
    ) -> wire.Reply:
        """Send *request* on a connection of its own and wait for its reply; cancelling
        closes the connection (the helper then cancels the request)."""
        channel = Channel(self.path)
        try:
            return await exchange(channel, request, timeout_s=timeout_s)
        finally:
            channel.close()

    def hello(self) -> wire.Welcome:
        """What the helper enforces (`HelperUnavailableError`, `HelperError` otherwise)."""
        reply = self.call_blocking(wire.Hello())
        if isinstance(reply, wire.Failed):
            _raise_failed(reply)
        if not isinstance(reply, wire.Welcome):
            raise HelperError("bad_reply", f"a {type(reply).__name__} to hello")
        if reply.version != wire.PROTOCOL_VERSION:
            raise HelperError(
                "version",
                f"helper speaks version {reply.version}, this daemon {wire.PROTOCOL_VERSION}",
            )
        return reply

    def reset(self, owner: Path) -> None:
        """Tell the helper the daemon of root *owner* starts: it closes the areas a previous
        run of that daemon left open."""
        reply = self.call_blocking(wire.Reset(owner=str(owner)))
        if isinstance(reply, wire.Failed):
            _raise_failed(reply)

    def area(
        self,
        *,
        session_id: str,
        package: Package,
        workspace: Path,
        forbidden: Sequence[str],
        owner: Path,
        environ: Mapping[str, str] = os.environ,
    ) -> RemoteArea:
        """The confined area of a session (nothing is sent before ``open``)."""
        env = {n: environ[n] for n in package.manifest.env_allow if n in environ}
        spec = wire.SessionSpec(
            session_id=session_id,
            package_id=package.package_id,
            package_dir=str(Path(os.path.abspath(package.directory))),
            manifest=manifest_wire(package),
            workspace=str(Path(os.path.abspath(workspace))),
            forbidden=tuple(forbidden),
            env=env,
            owner=str(owner),
        )
        return RemoteArea(self, spec)


async def exchange(channel: Channel, request: wire.Request, *, timeout_s: float) -> wire.Reply:
    """*request* on *channel*, and its reply; `HelperUnavailableError` when the helper cannot
    be reached, goes away or does not answer in *timeout_s*."""
    try:
        body = await channel.request(wire.encode(request), timeout_s=timeout_s)
    except OSError as exc:
        raise HelperUnavailableError(
            exc.errno or errno_.EPIPE, f"sandbox helper at {channel.path}: {exc}"
        ) from None
    except TimeoutError:
        raise HelperUnavailableError(
            errno_.ETIMEDOUT, f"sandbox helper at {channel.path}: no reply in {timeout_s:.0f} s"
        ) from None
    return wire.decode_reply(body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionResetError(errno_.ECONNRESET, "the helper closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class RemoteArea:
    """A session's `ConfinedArea` kept by the sandbox helper."""

    def __init__(self, client: HelperClient, spec: wire.SessionSpec) -> None:
        self.client = client
        self.spec = spec
        self._session_id = spec.session_id
        self._tmp_dir = Path("/nonexistent")
        self._output_dir = Path("/nonexistent")
        self._uid = self._gid = -1
        #: the session's levels, from the helper's last reply that carried them
        self._levels: dict[str, str] | None = None
        #: whether the areas may hold files (a run wrote some, or was cut short)
        self._dirty = False
        self._channel = Channel(client.path)

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def tmp_dir(self) -> Path:
        return self._tmp_dir

    @property
    def output_dir(self) -> Path:
        return self._output_dir

    @property
    def uid(self) -> int:
        return self._uid

    @property
    def gid(self) -> int:
        return self._gid

    def _opened(self, reply: wire.Reply) -> None:
        if isinstance(reply, wire.Failed):
            _raise_failed(reply)
        if not isinstance(reply, wire.Opened):
            raise HelperError("bad_reply", f"a {type(reply).__name__} to open")
        self._tmp_dir, self._output_dir = Path(reply.tmp_dir), Path(reply.output_dir)
        self._uid, self._gid = reply.uid, reply.gid
        self._levels, self._dirty = None, False

    def open(self) -> None:
        self._opened(self.client.call_blocking(wire.Open(session=self.spec)))

    def close(self) -> None:
        """Ask the helper to close the area; never raises (the session's ledgers must still
        be closed): a helper that cannot be reached reclaims the area when it starts again."""
        self._channel.close()
        try:
            reply = self.client.call_blocking(wire.Close(session_id=self._session_id))
        except (HelperUnavailableError, wire.HelperWireError) as exc:
            reply = wire.Failed(kind="unreachable", message=str(exc))
        if isinstance(reply, wire.Failed):
            _log.warning("helper_area_not_closed", session_id=self._session_id, error=reply.message)

    async def _send(
        self, request: wire.Request, *, timeout_s: float = _CALL_TIMEOUT_S
    ) -> wire.Reply:
        """*request* on the session's own connection (`Channel`), and its reply."""
        return await exchange(self._channel, request, timeout_s=timeout_s)

    async def _call(
        self, request: wire.Request, *, timeout_s: float = _CALL_TIMEOUT_S
    ) -> wire.Reply:
        """*request*, sent again once after opening the area when the helper lost it."""
        reply = await self._send(request, timeout_s=timeout_s)
        if isinstance(reply, wire.Failed) and reply.kind == "unknown_session":
            self._opened(await self._send(wire.Open(session=self.spec)))
            reply = await self._send(request, timeout_s=timeout_s)
        if isinstance(reply, wire.Failed):
            _raise_failed(reply)
        return reply

    async def confinement(self) -> dict[str, str]:
        if self._levels is not None:  # built once per area; each run's reply refreshes them
            return dict(self._levels)
        try:
            reply = await self._call(wire.Confine(session_id=self._session_id))
        except HelperUnavailableError as exc:  # the turn is refused, not failed: say why
            raise SandboxUnavailableError(mechanisms={"helper": str(exc)}) from None
        if not isinstance(reply, wire.Levels):
            raise HelperError("bad_reply", f"a {type(reply).__name__} to confine")
        self._levels = {**reply.levels, "helper": "separate"}  # the evidence says who did it
        return dict(self._levels)

    async def run_attempt(
        self,
        *,
        exe: str,
        argv: Sequence[str],
        declared: tuple[DeclaredOutput, ...],
        turn: int,
        attempt_no: int,
        timeout_s: float,
    ) -> ConfinedRun:
        start_ns = time.monotonic_ns()
        self._dirty = True  # until the reply says what the run left
        try:
            reply = await self._call(
                wire.Run(
                    session_id=self._session_id,
                    exe=exe,
                    argv=tuple(argv),
                    declared=declared,
                    turn=turn,
                    attempt_no=attempt_no,
                    timeout_s=timeout_s,
                ),
                timeout_s=timeout_s + _RUN_SLACK_S,
            )
        except HelperUnavailableError as exc:
            # The helper went away during the run (its processes are reclaimed when it starts
            # again) or cannot be reached: the attempt crashed; the attempt loop retries it.
            _log.error(
                "sandbox_helper_lost", session_id=self._session_id, turn=turn, error=str(exc)
            )
            return crashed_run(
                f"{HELPER_LOST}: {exc}", str(exc), attempt_no, start_ns, launcher="helper"
            )
        if not isinstance(reply, wire.Ran):
            raise HelperError("bad_reply", f"a {type(reply).__name__} to run")
        self._dirty = bool(reply.writes or reply.problems)
        self._levels = {**reply.levels, "helper": "separate"}
        return ConfinedRun(
            reply.record,
            reply.outcome,
            WriteSurface(reply.writes, reply.problems),
            [
                CapabilityViolation(
                    operation=v.operation,
                    target=v.target,
                    capability=v.capability,
                    session_id=v.session_id,
                    turn_number=v.turn_number,
                    detail=v.detail,
                )
                for v in reply.violations
            ],
        )

    async def promote(
        self, writes: Sequence[RealizedWrite], workspace: Path, *, done: list[PromotedOutput]
    ) -> None:
        if not writes:  # nothing declared to promote: no request
            return
        request = wire.Promote(
            session_id=self._session_id,
            paths=tuple(w.path for w in writes),
            workspace=str(workspace),
        )
        # Shielded: the promotion is short and all or nothing; its record must not be lost.
        with anyio.CancelScope(shield=True):
            reply = await self._send(request)
        if isinstance(reply, wire.Failed) and reply.kind == "unknown_session":
            # the helper restarted since the run: the area, and the outputs in it, are gone
            raise ConfinementLostError(
                errno_.ENOENT, f"sandbox helper at {self.client.path}: {reply.message}"
            )
        if isinstance(reply, wire.Failed):
            _raise_failed(reply)
        if not isinstance(reply, wire.Promoted):
            raise HelperError("bad_reply", f"a {type(reply).__name__} to promote")
        done.extend(reply.outputs)

    async def empty(self) -> None:
        if not self._dirty:  # the last run left nothing (a copy was promoted: still dirty)
            return
        await self._call(wire.Empty(session_id=self._session_id))
        self._dirty = False
