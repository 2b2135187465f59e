"""``hunter sandbox-helper``: the root half of a privilege-separated daemon (see __init__).

It serves the daemon's requests (wire.py) on one Unix socket with a `Runtime` of its own
root (its sessions' ``tmp/``, ``output/`` and lock; never the daemon's trees). Only the uids
it was told to trust may connect (``SO_PEERCRED``); any frame is answered or the connection
closed, never the helper stopped. It trusts the daemon with *what* a turn runs and under which
package (a turn only ever gets a sandbox uid's rights) but not with *where root writes*: the
areas are its own, derived from a checked session id; promotion takes paths of its own last
enumeration and writes with the daemon's file-system identity (`sandbox.confine.fsid`).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox.enumerate import RealizedWrite
from sandbox.errors import ManifestError, SandboxUnavailableError
from sandbox.helper import wire
from sandbox.packages import Package, parse_manifest
from sandbox.promote import PromotionError, promote_outputs
from sandbox.runtime.area import SessionArea, session_capabilities
from sandbox.runtime.runtime import Runtime
from sandbox.session_ids import is_session_id

__all__ = ["HelperServer", "peer_credentials"]

_log = structlog.get_logger("sandbox.helper.server")
_CRED: Final = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid, gid


class _Refused(Exception):
    """A request answered with `wire.Failed` (the connection goes on)."""

    def __init__(self, kind: str, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.reply = wire.Failed(kind=kind, message=message, errno=errno)


class _HelperSession:
    """A session's area in the helper, and the writes its last run left in ``output/``."""

    def __init__(self, spec: wire.SessionSpec, area: SessionArea) -> None:
        self.spec = spec
        self.area = area
        self.last_writes: dict[str, RealizedWrite] = {}


class HelperServer:
    """Serves the sandbox helper protocol for the uids in *allowed_uids* (root always)."""

    def __init__(self, runtime: Runtime, *, allowed_uids: Iterable[int]) -> None:
        self.runtime = runtime
        self.allowed_uids = frozenset(allowed_uids) | {0}
        self._sessions: dict[str, _HelperSession] = {}

    async def serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        """Serve connections until cancelled."""
        await listener.serve(self.handle)

    def close(self) -> None:
        """Close every session's area (kills what still runs; the runtime stays)."""
        for session in list(self._sessions.values()):
            session.area.close()
        self._sessions.clear()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        """One connection: requests answered one at a time until the peer closes it. Whatever
        happens on it ends that connection only, never the helper."""
        peer: tuple[int, int, int] | None = None
        try:
            async with stream:
                try:
                    peer = peer_credentials(stream.extra(anyio.abc.SocketAttribute.raw_socket))
                except OSError as exc:
                    _log.warning("helper_peer_unknown", error=str(exc))
                    return
                await self._connection(stream, peer)
        except Exception as exc:
            _log.exception(
                "helper_connection_failed",
                uid=None if peer is None else peer[1],
                pid=None if peer is None else peer[0],
                error=f"{type(exc).__name__}: {exc}",
            )

    async def _connection(self, stream: anyio.abc.SocketStream, peer: tuple[int, int, int]) -> None:
        _pid, uid, gid = peer
        if uid not in self.allowed_uids:
            _log.warning("helper_peer_refused", uid=uid)
            await _send(
                stream,
                wire.Failed(kind="forbidden", message=f"uid {uid} may not use the sandbox helper"),
            )
            return
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                header = await reader.receive_exactly(wire.HEADER_SIZE)
                body = await reader.receive_exactly(wire.frame_length(header))
            except (
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.BrokenResourceError,
                OSError,
            ):
                return
            except wire.HelperWireError as exc:
                await _send(stream, wire.Failed(kind="bad_request", message=str(exc)))
                return
            try:
                request = wire.decode_request(body)
            except wire.HelperWireError as exc:
                _log.warning("helper_bad_request", uid=uid, error=str(exc))
                await _send(stream, wire.Failed(kind="bad_request", message=str(exc)))
                return
            reply = await self._answer(request, reader, (uid, gid))
            if reply is None:  # the peer went away during a run: it was killed
                return
            if not await _send(stream, reply):
                return

    async def _answer(
        self, request: wire.Request, reader: BufferedByteReceiveStream, peer: tuple[int, int]
    ) -> wire.Reply | None:
        try:
            return await self._dispatch(request, reader, peer)
        except _Refused as exc:
            return exc.reply
        except PromotionError as exc:
            return wire.Failed(kind="promotion", message=str(exc))
        except SandboxUnavailableError as exc:
            return wire.Failed(kind="unavailable", message=str(exc))
        except OSError as exc:
            return wire.Failed(kind="os", message=str(exc), errno=exc.errno or 0)
        except Exception as exc:  # one bad request must not stop the helper
            _log.exception("helper_request_failed", op=type(request).__name__)
            return wire.Failed(kind="internal", message=f"{type(exc).__name__}: {exc}")

    def _session(self, session_id: str) -> _HelperSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise _Refused("unknown_session", f"no open area for session {session_id}")
        return session

    async def _dispatch(
        self, request: wire.Request, reader: BufferedByteReceiveStream, peer: tuple[int, int]
    ) -> wire.Reply | None:
        match request:
            case wire.Hello():
                return wire.Welcome(
                    version=wire.PROTOCOL_VERSION,
                    levels=dict(self.runtime.levels),
                    missing=dict(self.runtime.missing),
                    root=str(self.runtime.root),
                )
            case wire.Reset(owner=owner):
                left = [s for s in self._sessions.values() if s.spec.owner == owner]
                for stale in left:
                    self._sessions.pop(stale.spec.session_id, None)
                    await anyio.to_thread.run_sync(stale.area.close)
                _log.info("helper_areas_reset", owner=owner, closed=len(left))
                return wire.Done()
            case wire.Open(session=spec):
                return await self._open(spec)
            case wire.Confine(session_id=sid):
                return wire.Levels(levels=await self._session(sid).area.confinement())
            case wire.Run():
                return await self._run(request, reader)
            case wire.Promote():
                return await self._promote(request, peer)
            case wire.Empty(session_id=sid):
                await self._session(sid).area.empty()
                return wire.Done()
            case wire.Close(session_id=sid):
                session = self._sessions.pop(sid, None)
                if session is not None:
                    await anyio.to_thread.run_sync(session.area.close)
                    _log.info("helper_area_closed", session_id=sid)
                return wire.Done()
        raise _Refused("bad_request", f"unknown request {type(request).__name__}")

    async def _open(self, spec: wire.SessionSpec) -> wire.Reply:
        sid = spec.session_id
        if not is_session_id(sid):
            raise _Refused("bad_request", f"not a session id: {sid!r}")
        try:
            manifest = parse_manifest(spec.manifest, path=f"{spec.package_dir}/manifest.json")
        except ManifestError as exc:
            raise _Refused("bad_request", str(exc)) from None
        package = Package(spec.package_id, Path(spec.package_dir), manifest)
        previous = self._sessions.pop(sid, None)
        if previous is not None:  # the daemon restarted, or reopens: start from a clean area
            await anyio.to_thread.run_sync(previous.area.close)
        workspace = Path(spec.workspace)
        capabilities = session_capabilities(
            self.runtime, package, workspace, also_forbidden=spec.forbidden
        )
        area = SessionArea(self.runtime, session_id=sid, package=package, capabilities=capabilities)
        area.env_source = dict(spec.env)
        try:
            await anyio.to_thread.run_sync(area.open)
        except BaseException:
            area.close()
            raise
        self._sessions[sid] = _HelperSession(spec, area)
        _log.info("helper_area_opened", session_id=sid, uid=area.uid, package_id=spec.package_id)
        return wire.Opened(
            tmp_dir=str(area.tmp_dir), output_dir=str(area.output_dir), uid=area.uid, gid=area.gid
        )

    async def _run(self, request: wire.Run, reader: BufferedByteReceiveStream) -> wire.Reply | None:
        session = self._session(request.session_id)
        session.last_writes = {}
        ran: wire.Ran | None = None
        async with anyio.create_task_group() as tg:

            async def watch_peer() -> None:
                # The daemon sends nothing while it waits: data or EOF both mean it gave up.
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    await reader.receive(1)
                _log.warning(
                    "helper_run_abandoned", session_id=request.session_id, turn=request.turn
                )
                tg.cancel_scope.cancel()

            tg.start_soon(watch_peer)
            run = await session.area.run_attempt(
                exe=request.exe,
                argv=request.argv,
                declared=request.declared,
                turn=request.turn,
                attempt_no=request.attempt_no,
                timeout_s=request.timeout_s,
            )
            session.last_writes = run.surface.in_area("output")
            ran = wire.Ran(
                levels=await session.area.confinement(),
                record=run.record,
                outcome=run.outcome,
                writes=run.surface.writes,
                problems=run.surface.problems,
                violations=tuple(
                    wire.Violation(
                        operation=v.operation,
                        target=v.target,
                        capability=v.capability,
                        session_id=v.session_id,
                        turn_number=v.turn_number,
                        detail=v.detail,
                    )
                    for v in run.violations
                ),
            )
            tg.cancel_scope.cancel()
        return ran

    async def _promote(self, request: wire.Promote, peer: tuple[int, int]) -> wire.Reply:
        session = self._session(request.session_id)
        writes: list[RealizedWrite] = []
        for path in request.paths:
            write = session.last_writes.get(path)
            if write is None:
                raise _Refused("promotion", f"{path}: not a file the session's last run wrote")
            writes.append(write)
        session.last_writes = {}  # promoted once: the area is emptied next
        promoted = await anyio.to_thread.run_sync(
            functools.partial(
                promote_outputs,
                session.area.output_dir,
                writes,
                Path(request.workspace),
                writer=peer,
            )
        )
        return wire.Promoted(outputs=promoted)


async def _send(stream: anyio.abc.SocketStream, reply: wire.Reply) -> bool:
    """Send *reply*; False when the peer is gone (or the reply cannot be framed)."""
    try:
        frame = wire.encode(reply)
    except wire.HelperWireError as exc:
        frame = wire.encode(wire.Failed(kind="internal", message=str(exc)))
    try:
        await stream.send(frame)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        return False
    return True
