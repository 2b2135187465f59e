"""Where the control API opens, closes, reads and verifies sessions.

A session opens in the runtime first (its plane, its ledgers), then in the store; in a fleet
this daemon becomes its home and its first ledger lines are anchored before the client hears
of it. A session closes only when no turn of it is unfinished (here, or on another daemon of a
fleet) and none is being submitted: the session gate (`intake.SessionGate`) makes a submission
and a close refuse each other while under way, so no turn lands in a closed session.

It is apart from the front (`core.TurnCore`) and from the submit path: it changes when a
session's life does, and it is off a turn's path.
"""

from __future__ import annotations

from supervisor.errors import RequestError, UnknownSessionError
from supervisor.logging import get_logger
from supervisor.store.protocol import NewSession, SessionRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.fleet import Fleet
from supervisor.turns.intake import SessionGate
from supervisor.turns.runner import error_code
from supervisor.turns.sessions import verify_ledgers

__all__ = ["SessionDesk"]


class SessionDesk:
    """Opens, closes, reads and verifies sessions for the control API."""

    def __init__(self, deps: TurnDeps, gate: SessionGate, *, fleet: Fleet | None = None) -> None:
        self._deps = deps
        #: submissions under way and sessions being closed (shared with the submit path)
        self._gate = gate
        self._fleet = fleet
        self._log = get_logger("supervisor.turns")

    async def open(
        self,
        *,
        package_id: str,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
    ) -> SessionRecord:
        """Open a session of *package_id* here (and, in a fleet, home it here)."""
        if self._deps.draining:
            raise RequestError("draining", "the daemon is draining; open the session after restart")
        try:
            session = await self._deps.sessions.open(
                package_id=package_id, tier=tier, work_order_id=work_order_id, workspace=workspace
            )
        except Exception as exc:
            raise RequestError(
                error_code(exc, default="session_open_failed"),
                f"cannot open a session of package {package_id!r}: {exc}",
                package_id=package_id,
            ) from exc
        try:
            record = await self._deps.store.open_session(
                NewSession(
                    session_id=session.session_id,
                    package_id=package_id,
                    tier=tier,
                    work_order_id=work_order_id,
                    workspace=workspace,
                    tenant=tenant,
                    priority=priority,
                )
            )
        except BaseException:
            session.close()
            raise
        self._deps.sessions.add(session, record)
        if self._fleet is not None:
            await self._fleet.home_opened(session)
        self._log.info(
            "session_opened", session_id=record.session_id, package_id=package_id, tier=tier
        )
        return record

    async def close(self, session_id: str) -> SessionRecord:
        """Close a session with no unfinished turn and none being submitted (else
        ``session_busy``)."""
        await self.get(session_id)
        busy = self._deps.tracker.in_session(session_id)
        if not busy and self._fleet is not None:  # its turns may be on another daemon
            busy = await self._fleet.unfinished(session_id)
        if busy or self._gate.submitting(session_id):
            what = f"unfinished turns {busy}" if busy else "a turn being submitted"
            raise RequestError(
                "session_busy",
                f"session {session_id} still has {what}; wait for or cancel them",
                turn_ids=busy,
            )
        self._gate.closing.add(session_id)
        try:
            record = await self._deps.store.close_session(session_id)
        finally:
            self._gate.closing.discard(session_id)
        await self._deps.sessions.close(session_id)
        if self._fleet is not None:
            await self._fleet.closed(session_id)
        self._log.info("session_closed", session_id=session_id)
        return record

    async def records(self) -> list[SessionRecord]:
        """Every session the store holds."""
        return await self._deps.store.list_sessions()

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record (``unknown_session`` when the store has none)."""
        try:
            return await self._deps.store.get_session(session_id)
        except UnknownSessionError:
            raise RequestError(
                "unknown_session",
                f"no session {session_id!r}; list sessions with `hunter session list`",
                session_id=session_id,
            ) from None

    async def verify_ledgers(self, *, session_id: str | None = None) -> dict[str, object]:
        """Verify the exec and evidence ledgers of one session (or of every session). In a
        fleet, only those of the sessions this daemon homes (or no daemon does, when their
        files are here): the others are listed as checked on their home (`verify_ledgers`)."""
        if session_id is not None:
            records = [await self.get(session_id)]
        else:
            records = await self.records()
        homes = None
        if self._fleet is not None:
            wanted = None if session_id is None else [session_id]
            homes = await self._fleet.store.session_homes(wanted)
        self._deps.sessions.write_pending()
        report = await verify_ledgers(
            self._deps.settings.root, records, homes=homes, owner=self._deps.owner
        )
        ledgers, failures = report["ledgers"], report["failures"]
        if isinstance(ledgers, list) and isinstance(failures, list):
            self._deps.tracker.ledgers_verified(ledgers=len(ledgers), failures=len(failures))
        return report
