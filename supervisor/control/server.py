"""The control API on ``control.sock``: request/response frames that drive the turn core.

``docs/control-protocol.md`` is the normative description (framing, every operation, its
params, results and errors, the turn's states); what follows is a summary.

Wire format (same framing as ``executors.sock``, see ``supervisor.wire.frames``):

* request  ``{"id": <int|str>, "op": "<operation>", "params": {...}}``
* success  ``{"id": <same>, "ok": true, "result": {...}}``
* failure  ``{"id": <same>, "ok": false, "error": {"code": "...", "message": "...", ...}}``

A connection may carry many requests at once (each is served by its own task, so a long
``turn.wait`` does not hold up the others; a ``turn.submit`` of an instruction turn without an
idempotency key needs none: `supervisor.control.submits`); responses come back in completion
order, matched by ``id``. An error always names what was wrong, where, and what to do; its
``code`` is stable (see `ERROR_CODES`). A malformed frame closes that connection only: nothing
already accepted is lost.

Operations (params -> result):

* ``ping`` -> ``{pong, pid, protocol, root, control_socket}``
* ``session.open`` {package_id, tier?, work_order_id?, workspace?} -> session;
  ``session.close`` {session_id} -> session (refused while it has unfinished turns);
  ``session.list`` -> {sessions}; ``session.get`` {session_id} -> {session, package,
  package_problem} (the package's manifest as installed now)
* ``turn.submit`` {session_id, kind: "instruction"|"process", declared_outputs (required; []
  for instructions), declared_inputs?, phase?, idempotency_key?, timeout_ms?, wait_s?,
  answer?: "full"|"compact"} plus {command_type, target_url?, target_selector?, parameters?} or
  {argv} -> {turn, created} (``created`` false: the idempotency key was seen before with the
  same payload, this is that turn; with another payload the answer is
  ``idempotency_conflict``; ``wait_s``: answer only once the turn is final or parked, at most
  that long; ``answer`` "compact": ``turn`` is only its outcome, `compact_turn`;
  ``warnings``, when present: what the client should know at once, e.g. no connected executor
  serves the command type)
* ``turn.get`` {turn_id} -> {turn, ledger} (``ledger``: the turn's exec and evidence entries,
  their hashes); ``turn.wait`` {turn_id, timeout_s?, until?: [states], answer?} ->
  {turn} once final, escalated, or in one of ``until``; ``turn.cancel`` {turn_id, reason?,
  operator?} -> {turn};
  ``turns.list`` {session_id?, states?, package_id?, accepted_since_us?, accepted_until_us?,
  after_turn_id?, limit? (1..500)} -> {turns, next_after} (a page of the turns the filters keep,
  oldest first; pass ``next_after`` as ``after_turn_id`` for the next one, null at the end)
* ``turn.evidence`` {turn_id, offset?, length? (at most 512 KiB)} -> {sha256, size, offset,
  data (base64), more}: the evidence bytes the turn's executor sent, a slice at a time
* ``status`` -> {daemon, turn_core (also under its former key scheduler, for one release),
  store, turns_by_state, in_flight (the 100 oldest active turns), in_flight_total, hub,
  executors (the first 100 by id), executors_total}
* A connection may have 256 requests in progress; more get a ``busy`` error at once.
* An answer over the frame limit is a ``reply_too_large`` error; the connection stays open.
* ``executors.list`` {after_executor_id?, limit? (1..1000)} -> {executors, next_after} (a page
  by id); ``executors.wait`` {executor_id, status?, timeout_s?}
* ``escalations.list`` {after_turn_id?, limit? (1..500)} -> {escalations, next_after} (a page
  by turn id); ``escalations.resolve`` {turn_id, action: "retry"|"terminate", reason,
  operator?} -> {turn}
* ``ledger.verify`` {session_id?} -> {ok, ledgers, failures, elsewhere} (``elsewhere``, in a
  fleet: the sessions homed by another daemon, checked there)
* ``drain`` {reason?, operator?} -> {draining: true, decided_by} (the drain starts once the
  answer is written)
* The three decisions (``escalations.resolve``, ``turn.cancel``, ``drain``) are attributed:
  the caller's uid and pid from the socket's peer credentials, an operator name and a reason
  (`supervisor.turns.decisions`)
* ``events.subscribe`` {sessions?, turns?, kinds?, after?} -> {subscribed, cursor, gap,
  replayed}, then pushed ``{id, event}`` frames (`supervisor.control.subscriptions`);
  ``events.unsubscribe`` {subscription} -> {unsubscribed}

Layout: this module holds the protocol's table of operations (name -> handler), its error
codes and the one answer boundary (`ControlServer.handle`); the connections that carry the
requests (framing, the error boundary, busy refusals, the peer's credentials) are in
`supervisor.control.connections`; the handlers, grouped by the noun they act on, in
`supervisor.control.operations` (sessions, turns, executors, escalations, ledgers, the daemon);
the answers' shapes in `answers`, submits taken without a task in `submits`, replies in
`replies`, event subscriptions in `subscriptions`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import anyio.abc

from supervisor.control.connections import Connections
from supervisor.control.operations.daemon import CONTROL_PROTOCOL_VERSION, DaemonOperations
from supervisor.control.operations.escalations import EscalationOperations
from supervisor.control.operations.executors import ExecutorOperations
from supervisor.control.operations.ledgers import LedgerOperations
from supervisor.control.operations.sessions import SessionOperations
from supervisor.control.operations.turns import TurnOperations
from supervisor.control.submits import QuickSubmits
from supervisor.errors import RequestError, StoreIntegrityError
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.peercred import PeerCredentials
from supervisor.feed import Feed
from supervisor.logging import get_logger
from supervisor.turns.core import TurnCore
from supervisor.wire.control import (
    ControlRequest,
    RequestDecodeError,
    RequestId,
    convert_request,
    op_of,
)

__all__ = [
    "CONTROL_PROTOCOL_VERSION",
    "ERROR_CODES",
    "MAX_REQUESTS_PER_CONNECTION",
    "ControlServer",
]

#: Stable error codes of the control API and what each means.
ERROR_CODES: Final[Mapping[str, str]] = {
    "bad_request": "a field is missing or has the wrong type/value (see `field`)",
    "unknown_op": "the operation does not exist (see `operations`)",
    "unknown_session": "no session with that id",
    "unknown_turn": "no turn with that id",
    "unknown_package": "the package is not installed under <root>/installed/",
    "bad_manifest": "the package's manifest.json is invalid",
    "session_closed": "the session is closed; open a new one",
    "session_busy": "the session still has unfinished turns",
    "session_unavailable": "the session is not loaded in this daemon",
    "session_open_failed": "the sandbox runtime could not open the session",
    "invalid_instruction": "the instruction breaks a Phase-20 rule (see `field`)",
    "declaration_error": "declared_outputs/declared_inputs are missing or invalid",
    "capability_violation": "the request breaks the package's capabilities (recorded)",
    "sandbox_unavailable": "strict enforcement is on and a confinement mechanism is missing",
    "turn_rejected": "the sandbox runtime refused the turn",
    "queue_full": "backpressure: retry after `retry_after_ms`",
    "idempotency_conflict": "the idempotency key names a turn submitted with another payload",
    "draining": "the daemon is shutting down and accepts no new work",
    "not_cancellable": "the turn is not active",
    "not_escalated": "the turn is not parked for an operator",
    "no_evidence": "the turn has no stored evidence bytes (only a hash, or none)",
    "ledger_invalid": "a ledger failed verification",
    "timeout": "the awaited condition did not happen in time",
    "reply_too_large": "the answer is over the frame limit; ask for less (a session, a limit)",
    "busy": "this connection has too many requests in progress: retry after `retry_after_ms`",
    "subscriber_too_slow": "the client stopped reading its events: subscribe again `after` the"
    " cursor in `resume_after`",
    "internal": "a bug in the daemon (the log has the traceback)",
}

#: A handler takes its operation's decoded params (see ``supervisor.wire.control``).
Handler = Callable[[Any], Awaitable[object]]
#: ... and one of a decision also the caller's peer credentials (None: not known).
DecisionHandler = Callable[[Any, PeerCredentials | None], Awaitable[object]]

#: requests one connection may have in progress; more get a ``busy`` answer at once
MAX_REQUESTS_PER_CONNECTION = 256


class ControlServer:
    """Serves the control API for one `TurnCore` (plus hub and ledger views): the table of
    operations and the answer to each request; its connections are `Connections`."""

    def __init__(
        self,
        *,
        turn_core: TurnCore,
        hub: ExecutorHub,
        max_frame_bytes: int = 1_048_576,
        max_requests_per_connection: int = MAX_REQUESTS_PER_CONNECTION,
        on_drain: Callable[[], None] | None = None,
        info: Mapping[str, object] | None = None,
        sandbox: Callable[[], Mapping[str, object]] | None = None,
        feed: Feed | None = None,
    ) -> None:
        #: the change feed ``events.subscribe`` follows (the turn core's, or one of its own)
        feed = feed if feed is not None else (turn_core.feed or Feed())
        self._log = get_logger("supervisor.control.server")
        self._requests = 0
        self._connections = Connections(
            self,
            quick=QuickSubmits(turn_core, hub, self._failure),
            feed=feed,
            max_frame_bytes=max_frame_bytes,
            max_requests=max_requests_per_connection,
            on_drain=on_drain,
        )
        daemon = DaemonOperations(
            turn_core=turn_core,
            hub=hub,
            feed=feed,
            info=dict(info or {}),
            sandbox=sandbox,
            on_drain=on_drain,
        )
        sessions = SessionOperations(turn_core)
        turns = TurnOperations(turn_core, hub)
        executors = ExecutorOperations(hub)
        escalations = EscalationOperations(turn_core)
        self._ops: dict[str, Handler] = {
            "ping": daemon.ping,
            "session.open": sessions.open_session,
            "session.close": sessions.close_session,
            "session.list": sessions.list_sessions,
            "session.get": sessions.get_session,
            "turn.submit": turns.submit,
            "turn.get": turns.get,
            "turn.evidence": turns.evidence,
            "turn.wait": turns.wait,
            "turns.list": turns.list_turns,
            "status": daemon.status,
            "executors.list": executors.list_executors,
            "executors.wait": executors.wait,
            "escalations.list": escalations.list_escalations,
            "ledger.verify": LedgerOperations(turn_core).verify,
        }
        #: decisions: attributed to the caller (`supervisor.turns.decisions`)
        self._decisions: dict[str, DecisionHandler] = {
            "turn.cancel": turns.cancel,
            "escalations.resolve": escalations.resolve,
            "drain": daemon.drain,
        }

    @property
    def operations(self) -> list[str]:
        return sorted([*self._ops, *self._decisions, "events.subscribe", "events.unsubscribe"])

    async def serve(
        self,
        listener: anyio.abc.Listener[anyio.abc.SocketStream],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept control connections until cancelled; one task per connection."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            await listener.serve(self._connection, task_group=tg)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        """One control connection (`Connections.serve`: it costs this connection only)."""
        await self._connections.serve(stream)

    async def handle(
        self,
        request: ControlRequest | RequestDecodeError | Mapping[str, object],
        *,
        peer: PeerCredentials | None = None,
    ) -> dict[str, object]:
        """Answer one request (never raises for bad input): a decoded request, the error its
        body decoded to, or a frame already decoded to a dict (checked here the same way).
        *peer*: who sent it (the socket's peer credentials), to whom decisions are attributed;
        None for a request that came through no socket."""
        self._requests += 1
        if isinstance(request, Mapping):
            try:
                request = convert_request(request)
            except RequestDecodeError as exc:
                request = exc
        if isinstance(request, RequestDecodeError):
            return {"id": request.request_id, "ok": False, "error": request.to_wire()}
        op = op_of(request)
        try:
            result = await self._dispatch(op, request.params, peer)
        except Exception as exc:
            return self._failure(request.id, op, exc)
        return {"id": request.id, "ok": True, "result": result}

    def _failure(self, request_id: RequestId, op: str, exc: Exception) -> dict[str, object]:
        """The answer to a request that raised *exc*: its code and message (a bug: logged
        with its traceback, answered ``internal``)."""
        if isinstance(exc, RequestError):
            return {"id": request_id, "ok": False, "error": exc.to_wire()}
        if isinstance(exc, StoreIntegrityError):  # a damaged or foreign row: named, no traceback
            self._log.error("store_row_invalid", op=op, table=exc.table, key=str(exc.key))
            return {
                "id": request_id,
                "ok": False,
                "error": {"code": "store_integrity", "message": f"{op}: {exc}"},
            }
        self._log.error("control_request_failed", op=op, exc_info=exc)
        return {
            "id": request_id,
            "ok": False,
            "error": {
                "code": "internal",
                "message": f"{op}: internal error {type(exc).__name__}: {exc}",
            },
        }

    async def _dispatch(
        self, op: str, params: object, peer: PeerCredentials | None = None
    ) -> object:
        decide = self._decisions.get(op)
        if decide is not None:
            return await decide(params, peer)
        handler = self._ops.get(op)
        if handler is None:  # decoded requests name known operations; kept for subclasses
            raise RequestError(
                "unknown_op",
                f"unknown operation {op!r}; known: {', '.join(self.operations)}",
                operations=self.operations,
            )
        return await handler(params)
