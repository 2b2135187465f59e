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

About 750 lines (`ControlServer` about 525), past the usual 600/400: the connection handling
(framing, the error boundary, busy refusals, the peer's credentials) and one short handler per
operation of the protocol (20 of them), which read and answer through the turn core; the
answers' shapes are in `supervisor.control.answers`, submits taken without a task in
`submits`, replies in `replies`, event subscriptions in `subscriptions`. Split by operation,
each handler would need the same five neighbours passed in.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from typing import Any, Final

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from ledger import session_dir_for
from sandbox.policy.lifecycle import TurnState
from supervisor.control.answers import (
    EvidenceMissing,
    evidence_slice,
    executor_answer,
    package_answer,
    statistics_answer,
    turn_answer,
    turn_ledger_entries,
)
from supervisor.control.replies import Replies
from supervisor.control.submits import QuickSubmits, submit_warnings
from supervisor.control.subscriptions import Subscriptions
from supervisor.errors import RequestError, StoreIntegrityError
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.peercred import PeerCredentials, stream_peer_credentials
from supervisor.feed import Feed
from supervisor.logging import describe_error, get_logger
from supervisor.stages import stage_costs
from supervisor.store.protocol import TurnRecord
from supervisor.turns.core import TurnCore
from supervisor.turns.decisions import Decision, operator_name
from supervisor.turns.requests import turn_request
from supervisor.wire.control import (
    ControlRequest,
    DrainParams,
    EscalationResolveParams,
    EscalationsListParams,
    EventsSubscribe,
    EventsUnsubscribe,
    ExecutorsListParams,
    ExecutorsWaitParams,
    NoParams,
    RequestDecodeError,
    RequestId,
    SessionFilter,
    SessionOpenParams,
    SessionRef,
    TurnCancelParams,
    TurnEvidenceParams,
    TurnRef,
    TurnsListParams,
    TurnSubmit,
    TurnSubmitParams,
    TurnWaitParams,
    convert_request,
    decode_request,
    op_of,
)
from supervisor.wire.frames import FrameError, FrameReader, FrameTooLarge, FrameWriter, encode_frame

__all__ = [
    "CONTROL_PROTOCOL_VERSION",
    "ERROR_CODES",
    "MAX_REQUESTS_PER_CONNECTION",
    "ControlServer",
]

_COSTS: Final = stage_costs()
CONTROL_PROTOCOL_VERSION: Final = 1

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

#: Operations that change state: they finish even if the client disconnects meanwhile
#: (``turn.submit`` shields its own accept-and-schedule step, not its optional wait).
_STATE_CHANGING: Final = frozenset(
    {"session.open", "session.close", "turn.cancel", "escalations.resolve", "drain"}
)


#: `status` lists at most this many active turns (the oldest); ``in_flight_total`` counts all
_IN_FLIGHT_SHOWN = 100
#: ... and at most this many executors (by id); ``executors_total`` counts all
_EXECUTORS_SHOWN = 100
#: requests one connection may have in progress; more get a ``busy`` answer at once
MAX_REQUESTS_PER_CONNECTION = 256
#: How long `status` waits for the store's counts before answering without them.
_STORE_READ_S = 1.0


class ControlServer:
    """Serves the control API for one `TurnCore` (plus hub and ledger views)."""

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
        self._turn_core = turn_core
        #: the change feed ``events.subscribe`` follows (the turn core's, or one of its own)
        self._feed = feed if feed is not None else (turn_core.feed or Feed())
        self._sandbox = sandbox  # the sandbox's enforcement now, for `status`
        self._hub = hub
        self._quick = QuickSubmits(turn_core, hub, self._failure)
        self._max_frame_bytes = max_frame_bytes
        self._max_requests = max_requests_per_connection
        self._on_drain = on_drain
        self._info = dict(info or {})
        self._log = get_logger("supervisor.control.server")
        self._connections = 0
        self._requests = 0
        self._ops: dict[str, Handler] = {
            "ping": self._ping,
            "session.open": self._session_open,
            "session.close": self._session_close,
            "session.list": self._session_list,
            "session.get": self._session_get,
            "turn.submit": self._turn_submit,
            "turn.get": self._turn_get,
            "turn.evidence": self._turn_evidence,
            "turn.wait": self._turn_wait,
            "turns.list": self._turns_list,
            "status": self._status,
            "executors.list": self._executors_list,
            "executors.wait": self._executors_wait,
            "escalations.list": self._escalations_list,
            "ledger.verify": self._ledger_verify,
        }
        #: decisions: attributed to the caller (`supervisor.turns.decisions`)
        self._decisions: dict[str, DecisionHandler] = {
            "turn.cancel": self._turn_cancel,
            "escalations.resolve": self._escalations_resolve,
            "drain": self._drain,
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
        """One control connection, and its error boundary: whatever happens on it, an exception
        nobody foresaw included, costs this connection only (closed, and logged with the peer's
        uid and pid), never the server or the daemon. Cancellation passes through."""
        self._connections += 1
        creds = stream_peer_credentials(stream)
        try:
            await self._serve_connection(stream, creds)
        except Exception as exc:
            self._log.exception(
                "control_connection_failed",
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
                error=describe_error(exc),
            )
            with contextlib.suppress(Exception):
                await stream.aclose()
        finally:
            self._connections -= 1

    async def _serve_connection(
        self, stream: anyio.abc.SocketStream, peer: PeerCredentials | None
    ) -> None:
        reader = FrameReader(stream, max_bytes=self._max_frame_bytes)
        # Corked writer: answers completed in the same event-loop pass (a group commit ends
        # many turns at once) leave in one send; a lone answer is written at once.
        writer = FrameWriter(stream)
        in_progress = [0]  # requests of this connection being served by a task
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            replies = Replies(writer, tg, max_frame_bytes=self._max_frame_bytes)
            tg.start_soon(replies.timers.run)
            # Let the writer start before the first request is read: a request already in the
            # socket is read without a wait, and its answer may be handed over without one.
            await anyio.lowlevel.checkpoint()
            subscriptions = Subscriptions(self._feed, writer)
            try:
                await self._read_requests(
                    reader, writer, tg, replies, in_progress, subscriptions=subscriptions, peer=peer
                )
            finally:
                subscriptions.close()
                replies.close()
            # The client went away: nobody will read the answers. Waits and reads in progress
            # are cancelled; requests that change state run to the end (they are shielded).
            tg.cancel_scope.cancel()

    async def _read_requests(
        self,
        reader: FrameReader,
        writer: FrameWriter,
        tg: anyio.abc.TaskGroup,
        replies: Replies,
        in_progress: list[int],
        *,
        subscriptions: Subscriptions,
        peer: PeerCredentials | None,
    ) -> None:
        while True:
            try:
                body = await reader.read_body()
                request: ControlRequest | RequestDecodeError
                started = _COSTS.clock()
                try:
                    request = decode_request(body)
                except RequestDecodeError as exc:
                    request = exc
                _COSTS.add("decode", _COSTS.clock() - started)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
            except FrameError as exc:
                self._log.warning("control_frame_error", reason=exc.reason)
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await writer.send(
                        encode_frame(
                            {
                                "id": None,
                                "ok": False,
                                "error": {
                                    "code": "bad_request",
                                    "message": f"bad frame: {exc.reason}; closing connection",
                                },
                            }
                        ),
                        cork=False,
                    )
                    await writer.flush()
                break
            if in_progress[0] + replies.owed >= self._max_requests:
                await self._refuse_busy(writer, request)
                continue
            if isinstance(request, EventsSubscribe | EventsUnsubscribe):
                self._requests += 1
                subscriptions.handle(request)  # answered at once; events follow by callback
                continue
            if isinstance(request, TurnSubmit) and self._quick.take(replies, request):
                self._requests += 1
                continue  # taken without a task: its answer comes from a callback
            in_progress[0] += 1
            tg.start_soon(self._serve_counted, writer, request, in_progress, peer)

    async def _serve_counted(
        self,
        writer: FrameWriter,
        request: ControlRequest | RequestDecodeError,
        in_progress: list[int],
        peer: PeerCredentials | None,
    ) -> None:
        try:
            await self._serve_request(writer, request, peer)
        finally:
            in_progress[0] -= 1

    async def _refuse_busy(
        self, writer: FrameWriter, request: ControlRequest | RequestDecodeError
    ) -> None:
        request_id = request.request_id if isinstance(request, RequestDecodeError) else request.id
        self._log.warning("control_connection_busy", limit=self._max_requests)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(
                encode_frame(
                    {
                        "id": request_id,
                        "ok": False,
                        "error": {
                            "code": "busy",
                            "message": (
                                f"this connection already has {self._max_requests} requests in"
                                " progress; wait for answers or open another connection"
                            ),
                            "retry_after_ms": 100,
                        },
                    }
                )
            )

    async def _serve_request(
        self,
        writer: FrameWriter,
        request: ControlRequest | RequestDecodeError,
        peer: PeerCredentials | None = None,
    ) -> None:
        op = None if isinstance(request, RequestDecodeError) else op_of(request)
        if op in _STATE_CHANGING:
            with anyio.CancelScope(shield=True):
                response = await self.handle(request, peer=peer)
        else:
            response = await self.handle(request, peer=peer)
        draining = op == "drain" and response["ok"] and self._on_drain is not None
        started = _COSTS.clock()
        try:
            frame = encode_frame(response, max_bytes=self._max_frame_bytes)
            _COSTS.add("reply", _COSTS.clock() - started)
        except FrameTooLarge as exc:  # the client would refuse it: say so, keep the connection
            self._log.warning("control_reply_too_large", op=op, size=exc.size)
            frame = encode_frame(
                {
                    "id": response.get("id"),
                    "ok": False,
                    "error": {
                        "code": "reply_too_large",
                        "message": (
                            f"the answer to {op} is {exc.size} bytes, over the"
                            f" {exc.max_bytes}-byte frame limit; ask for less (a session, a"
                            " smaller limit)"
                        ),
                    },
                }
            )
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(frame, cork=False if draining else None)
            if draining:
                await writer.flush()
        if draining and self._on_drain is not None:
            self._on_drain()  # after the answer is on its way: the drain may close this stream

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

    # -- operations -----------------------------------------------------------------------

    async def _ping(self, params: NoParams) -> object:
        return {
            "pong": True,
            "pid": os.getpid(),
            "protocol": CONTROL_PROTOCOL_VERSION,
            **self._info,
        }

    async def _session_open(self, params: SessionOpenParams) -> object:
        row = await self._turn_core.open_session(
            package_id=params.package_id,
            tier=params.tier or "default",
            work_order_id=params.work_order_id,
            workspace=params.workspace,
            tenant=params.tenant,
            priority=params.priority,
        )
        return row.to_dict()

    async def _session_close(self, params: SessionRef) -> object:
        sid = params.session_id
        return (await self._turn_core.close_session(sid)).to_dict()

    async def _session_get(self, params: SessionRef) -> object:
        record = await self._turn_core.get_session(params.session_id)
        path = self._turn_core.settings.root / "installed" / record.package_id / "manifest.json"
        return {"session": record.to_dict(), **await anyio.to_thread.run_sync(package_answer, path)}

    async def _session_list(self, params: NoParams) -> object:
        return {"sessions": [s.to_dict() for s in await self._turn_core.list_sessions()]}

    async def _turn_submit(self, params: TurnSubmitParams) -> object:
        # Types were checked at decode time (``wait_s`` included: an error answer must mean
        # "nothing accepted"); the declaration and Phase-20 rules are applied here.
        started = _COSTS.clock()
        request = turn_request(
            params, default_timeout_ms=self._turn_core.settings.default_timeout_ms
        )
        _COSTS.add("admit", _COSTS.clock() - started)
        wait = params.wait_s
        with anyio.CancelScope(shield=True):  # accepted means scheduled, client or not
            turn, created = await self._turn_core.submit(request)
        warnings = submit_warnings(self._hub, request, self._turn_core.served_by_peers)
        if wait is not None:
            # submit-and-wait in one round trip: answers once the turn is final or parked
            turn = await self._turn_core.wait_turn(turn.turn_id, timeout_s=float(wait))
        started = _COSTS.clock()
        answer: dict[str, object] = {"turn": turn_answer(turn, params.answer), "created": created}
        _COSTS.add("reply", _COSTS.clock() - started, 0)
        if warnings:
            answer["warnings"] = warnings
        return answer

    async def _turn_get(self, params: TurnRef) -> object:
        turn = await self._turn_core.get_turn(params.id)
        return {"turn": turn_answer(turn), "ledger": await self._turn_ledger(turn)}

    async def _turn_ledger(self, turn: TurnRecord) -> dict[str, object]:
        """The turn's entries in its session's exec and evidence ledger files (read only)."""
        try:
            session = await self._turn_core.get_session(turn.session_id)
        except RequestError:
            return {"exec": [], "evidence": []}
        session_dir = session_dir_for(
            self._turn_core.settings.root, session.tier, session.session_id
        )
        return await anyio.to_thread.run_sync(turn_ledger_entries, session_dir, turn.turn_number)

    async def _turn_evidence(self, params: TurnEvidenceParams) -> object:
        turn = await self._turn_core.get_turn(params.id)
        session = await self._turn_core.get_session(turn.session_id)
        session_dir = session_dir_for(
            self._turn_core.settings.root, session.tier, session.session_id
        )
        read = functools.partial(
            evidence_slice, session_dir, turn.result, params.offset, params.length
        )
        try:
            return await anyio.to_thread.run_sync(read)
        except EvidenceMissing as exc:
            raise RequestError(
                "no_evidence", f"turn {turn.turn_id}: {exc}", turn_id=turn.turn_id
            ) from None

    async def _turn_wait(self, params: TurnWaitParams) -> object:
        timeout = params.timeout_s
        until = params.until
        turn = await self._turn_core.wait_turn(
            params.id,
            timeout_s=float(timeout) if timeout is not None else None,
            until=until,
        )
        return {"turn": turn_answer(turn, params.answer)}

    async def _turn_cancel(self, params: TurnCancelParams, peer: PeerCredentials | None) -> object:
        decision = await _decision("cancel", peer, params.operator, params.reason)
        return {"turn": turn_answer(await self._turn_core.cancel_turn(params.id, decision))}

    async def _turns_list(self, params: TurnsListParams) -> object:
        turns = await self._turn_core.list_turns(
            session_id=params.session_id,
            states=params.states,
            package_id=params.package_id,
            accepted_since_us=params.accepted_since_us,
            accepted_until_us=params.accepted_until_us,
            after_turn_id=params.after_turn_id,
            limit=params.limit + 1,
        )
        more = len(turns) > params.limit
        turns = turns[: params.limit]
        return {
            "turns": [turn_answer(t) for t in turns],
            # pass as after_turn_id for the next page; null on the last page
            "next_after": turns[-1].turn_id if more else None,
        }

    async def _status(self, params: NoParams) -> object:
        executors = sorted(self._hub.list_executors(), key=lambda i: i.executor_id)
        stats = self._turn_core.statistics()
        hub_stats = self._hub.statistics()
        # The store's part is bounded: while its server is unreachable, status still answers
        # at once from what the daemon holds (store.available says so).
        counts: dict[str, int] = {}
        fleet = None
        with anyio.move_on_after(_STORE_READ_S):
            counts = await self._turn_core.counts()
            fleet = await self._turn_core.daemons()
        turns = stats.to_dict()
        turns["turns_escalated"] = counts.get(TurnState.ESCALATED.value, 0)
        # a daemon whose heartbeat is older than the lease is gone (its work is taken over)
        now_us = time.time_ns() // 1000
        lease_us = self._turn_core.settings.lease_ms * 1000
        return {
            # several daemons on one PostgreSQL: each with its last heartbeat (None: alone)
            "daemons": None
            if fleet is None
            else [
                {**d.to_dict(), "alive": now_us - d.heartbeat_us <= lease_us}
                for d in fleet[:_EXECUTORS_SHOWN]
            ],
            "daemon": {"pid": os.getpid(), "draining": stats.draining, **self._info},
            "turn_core": turns,
            "scheduler": turns,  # the former key of turn_core, kept for one more release
            "store": asdict(self._turn_core.store_statistics()),
            "turns_by_state": counts,
            "in_flight": self._turn_core.in_flight(limit=_IN_FLIGHT_SHOWN),
            "in_flight_total": turns["turns_active"],
            "hub": statistics_answer(hub_stats),
            "executors": [executor_answer(i) for i in executors[:_EXECUTORS_SHOWN]],
            "executors_total": len(executors),
            # the daemon-wide retry budget's window (docs/policy.md "The retry budget")
            "retry_budget": self._turn_core.retry_budget().to_dict(),
            "sandbox": None if self._sandbox is None else dict(self._sandbox()),
            # CPU per stage of a turn's path (`supervisor.stages`; on with HUNTER_STAGE_COSTS=1)
            "stages": _COSTS.snapshot(),
            # the change feed (`events.subscribe`): its newest cursor, who follows it
            "events": {
                "cursor": self._feed.cursor,
                "published": self._feed.published,
                "subscribers": self._feed.subscribers,
                "cut_off": self._feed.cut_off,
            },
        }

    async def _executors_list(self, params: ExecutorsListParams) -> object:
        known = sorted(
            (i for i in self._hub.list_executors() if i.executor_id > params.after_executor_id),
            key=lambda i: i.executor_id,
        )
        page = known[: params.limit]
        return {
            "executors": [executor_answer(i) for i in page],
            # pass as after_executor_id for the next page; null on the last page
            "next_after": page[-1].executor_id if len(known) > params.limit else None,
        }

    async def _executors_wait(self, params: ExecutorsWaitParams) -> object:
        """Wait until an executor is known with a status (default READY); for tools and tests."""
        executor_id = params.executor_id
        status = params.status
        status_value = None if status is None else status.value
        timeout = params.timeout_s
        with anyio.move_on_after(float(timeout)):
            info = await self._hub.wait_for_executor(executor_id, status=status)
            return {"executor": executor_answer(info)}
        raise RequestError(
            "timeout",
            f"executor {executor_id!r} did not reach {status_value} within {timeout} s",
            executor_id=executor_id,
        )

    async def _escalations_list(self, params: EscalationsListParams) -> object:
        page = await self._turn_core.list_escalations(
            after_turn_id=params.after_turn_id, limit=params.limit
        )
        return {"escalations": [turn_answer(t) for t in page.turns], "next_after": page.next_after}

    async def _escalations_resolve(
        self, params: EscalationResolveParams, peer: PeerCredentials | None
    ) -> object:
        action = params.action
        decision = await _decision(action, peer, params.operator, params.reason)
        turn = await self._turn_core.resolve_escalation(params.id, action, decision)
        return {"turn": turn_answer(turn)}

    async def _ledger_verify(self, params: SessionFilter) -> object:
        sid = params.session_id
        return await self._turn_core.verify_ledgers(session_id=sid)

    async def _drain(self, params: DrainParams, peer: PeerCredentials | None) -> object:
        if self._on_drain is None:
            raise RequestError("bad_request", "drain: this server cannot be drained remotely")
        decision = await _decision("drain", peer, params.operator, params.reason)
        self._log.info(
            "drain_requested",
            uid=decision.uid,
            pid=decision.pid,
            operator=decision.operator,
            reason=decision.reason,
        )
        # the drain starts once this answer is written
        return {"draining": True, "decided_by": decision.to_dict()}


async def _decision(
    action: str, peer: PeerCredentials | None, operator: str | None, reason: str | None
) -> Decision:
    """A decision of the caller *peer* (`supervisor.turns.decisions`): its uid and pid are the
    kernel's, the operator name the client's or, by default, the user name of that uid (looked
    up on a worker thread: a user database may be remote)."""
    uid = peer.uid if peer is not None else None
    if operator is None:
        operator = await anyio.to_thread.run_sync(operator_name, uid)
    return Decision.now(
        action,
        uid=uid,
        pid=peer.pid if peer is not None else None,
        operator=operator.strip(),
        reason=reason.strip() if reason is not None else None,
    )
