"""The control API on ``control.sock``: request/response frames that drive the scheduler.

Wire format (same framing as ``executors.sock``, see ``supervisor.wire.frames``):

* request  ``{"id": <int|str>, "op": "<operation>", "params": {...}}``
* success  ``{"id": <same>, "ok": true, "result": {...}}``
* failure  ``{"id": <same>, "ok": false, "error": {"code": "...", "message": "...", ...}}``

A connection may carry many requests at once (each is served by its own task, so a long
``turn.wait`` does not hold up the others); responses come back in completion order, matched by
``id``. An error always names what was wrong, where, and what to do; its ``code`` is stable (see
`ERROR_CODES`). A malformed frame closes that connection only: nothing already accepted is lost.

Operations (params -> result):

* ``ping`` -> ``{pong, pid, protocol, root, control_socket}``
* ``session.open`` {package_id, tier?, work_order_id?, workspace?} -> session;
  ``session.close`` {session_id} -> session (refused while it has unfinished turns);
  ``session.list`` -> {sessions}
* ``turn.submit`` {session_id, kind: "instruction"|"process", declared_outputs (required; []
  for instructions), declared_inputs?, phase?, idempotency_key?, timeout_ms?, wait_s?} plus
  {command_type, target_url?, target_selector?, parameters?} or {argv} -> {turn, created}
  (``created`` false: the idempotency key was seen before, this is that turn; ``wait_s``:
  answer only once the turn is final or parked, at most that long)
* ``turn.get`` {turn_id} -> {turn}; ``turn.wait`` {turn_id, timeout_s?, until?: [states]} ->
  {turn} once final, escalated, or in one of ``until``; ``turn.cancel`` {turn_id} -> {turn};
  ``turns.list`` {session_id?} -> {turns}
* ``status`` -> {daemon, scheduler, intake, turns_by_state, in_flight, hub, executors}
* ``executors.list`` -> {executors}; ``executors.wait`` {executor_id, status?, timeout_s?}
* ``escalations.list`` -> {escalations}; ``escalations.resolve`` {turn_id, action:
  "retry"|"terminate"} -> {turn}
* ``ledger.verify`` {session_id?} -> {ok, ledgers, failures}
* ``drain`` -> {draining: true} (the drain starts once the answer is written)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread

from supervisor.errors import RequestError
from supervisor.logging import get_logger
from supervisor.store.sqlite.intake import TurnRow, TurnState
from supervisor.turns.requests import parse_turn_request
from supervisor.turns.scheduler import Scheduler
from supervisor.wire.frames import FrameError, FrameReader, FrameWriter, encode_frame

__all__ = ["CONTROL_PROTOCOL_VERSION", "ERROR_CODES", "ControlServer"]

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
    "draining": "the daemon is shutting down and accepts no new work",
    "not_cancellable": "the turn is not active",
    "not_escalated": "the turn is not parked for an operator",
    "ledger_invalid": "a ledger failed verification",
    "timeout": "the awaited condition did not happen in time",
    "internal": "a bug in the daemon (the log has the traceback)",
}

Handler = Callable[[Mapping[str, Any]], Awaitable[object]]

#: Operations that change state: they finish even if the client disconnects meanwhile
#: (``turn.submit`` shields its own accept-and-schedule step, not its optional wait).
_STATE_CHANGING: Final = frozenset(
    {"session.open", "session.close", "turn.cancel", "escalations.resolve", "drain"}
)


#: Turn ids are SQLite integer keys: positive and below 2**63.
_MAX_TURN_ID: Final = 2**63 - 1


def _turn_id(params: Mapping[str, Any]) -> int:
    value = params.get("turn_id")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        # A number too long to be an id is "no such turn", never a conversion error.
        value = int(value) if len(value) <= 19 else _MAX_TURN_ID + 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError("bad_request", "turn_id: must be an integer turn id", field="turn_id")
    if not 1 <= value <= _MAX_TURN_ID:
        shown = str(value) if len(str(value)) <= 30 else f"{str(value)[:20]}..."
        raise RequestError("unknown_turn", f"no turn {shown}; see `hunter status`", turn_id=shown)
    return value


def _str(params: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f"{key}: must be a non-empty string", field=key)
    return value


def _turn(turn: TurnRow) -> dict[str, object]:
    return turn.to_dict()


class ControlServer:
    """Serves the control API for one `Scheduler` (plus hub and ledger views)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        hub: Any,
        max_frame_bytes: int = 1_048_576,
        on_drain: Callable[[], None] | None = None,
        info: Mapping[str, object] | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._hub = hub
        self._max_frame_bytes = max_frame_bytes
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
            "turn.submit": self._turn_submit,
            "turn.get": self._turn_get,
            "turn.wait": self._turn_wait,
            "turn.cancel": self._turn_cancel,
            "turns.list": self._turns_list,
            "status": self._status,
            "executors.list": self._executors_list,
            "executors.wait": self._executors_wait,
            "escalations.list": self._escalations_list,
            "escalations.resolve": self._escalations_resolve,
            "ledger.verify": self._ledger_verify,
            "drain": self._drain,
        }

    @property
    def operations(self) -> list[str]:
        return sorted(self._ops)

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
        self._connections += 1
        reader = FrameReader(stream, max_bytes=self._max_frame_bytes)
        # Corked writer: answers completed in the same event-loop pass (a group commit ends
        # many turns at once) leave in one send; a lone answer is written at once.
        writer = FrameWriter(stream)
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            while True:
                try:
                    frame = await reader.read()
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
                tg.start_soon(self._serve_request, writer, frame)
            # The client went away: nobody will read the answers. Waits and reads in progress
            # are cancelled; requests that change state run to the end (they are shielded).
            tg.cancel_scope.cancel()
        self._connections -= 1

    async def _serve_request(self, writer: FrameWriter, frame: Mapping[str, Any]) -> None:
        op = frame.get("op")
        # `op` is untrusted: an object or list here must be answered as a bad request by
        # `handle`, never looked up in a set (that raised TypeError and stopped the daemon).
        if isinstance(op, str) and op in _STATE_CHANGING:
            with anyio.CancelScope(shield=True):
                response = await self.handle(frame)
        else:
            response = await self.handle(frame)
        draining = op == "drain" and response["ok"] and self._on_drain is not None
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(encode_frame(response), cork=False if draining else None)
            if draining:
                await writer.flush()
        if draining and self._on_drain is not None:
            self._on_drain()  # after the answer is on its way: the drain may close this stream

    async def handle(self, frame: Mapping[str, Any]) -> dict[str, object]:
        """Answer one request frame (never raises for bad input)."""
        self._requests += 1
        req_id = frame.get("id")
        op = frame.get("op")
        params = frame.get("params", {})
        if isinstance(req_id, bool) or not isinstance(req_id, str | int | None):
            error = RequestError("bad_request", "id: must be an integer or a string", field="id")
            return {"id": None, "ok": False, "error": error.to_wire()}
        try:
            result = await self._dispatch(op, params)
        except RequestError as exc:
            return {"id": req_id, "ok": False, "error": exc.to_wire()}
        except Exception as exc:
            self._log.exception("control_request_failed", op=op)
            return {
                "id": req_id,
                "ok": False,
                "error": {
                    "code": "internal",
                    "message": f"{op}: internal error {type(exc).__name__}: {exc}",
                },
            }
        return {"id": req_id, "ok": True, "result": result}

    async def _dispatch(self, op: object, params: object) -> object:
        if not isinstance(op, str):
            raise RequestError("bad_request", "op: every request needs an 'op' string")
        if not isinstance(params, Mapping):
            raise RequestError("bad_request", "params: must be an object", field="params")
        handler = self._ops.get(op)
        if handler is None:
            raise RequestError(
                "unknown_op",
                f"unknown operation {op!r}; known: {', '.join(self.operations)}",
                operations=self.operations,
            )
        return await handler(params)

    # -- operations -----------------------------------------------------------------------

    async def _ping(self, params: Mapping[str, Any]) -> object:
        return {
            "pong": True,
            "pid": os.getpid(),
            "protocol": CONTROL_PROTOCOL_VERSION,
            **self._info,
        }

    async def _session_open(self, params: Mapping[str, Any]) -> object:
        package_id = _str(params, "package_id")
        assert package_id is not None
        row = await self._scheduler.open_session(
            package_id=package_id,
            tier=_str(params, "tier", required=False) or "default",
            work_order_id=_str(params, "work_order_id", required=False),
            workspace=_str(params, "workspace", required=False),
        )
        return row.to_dict()

    async def _session_close(self, params: Mapping[str, Any]) -> object:
        sid = _str(params, "session_id")
        assert sid is not None
        return (await self._scheduler.close_session(sid)).to_dict()

    async def _session_list(self, params: Mapping[str, Any]) -> object:
        return {"sessions": [s.to_dict() for s in await self._scheduler.list_sessions()]}

    async def _turn_submit(self, params: Mapping[str, Any]) -> object:
        request = parse_turn_request(
            params, default_timeout_ms=self._scheduler.settings.default_timeout_ms
        )
        # Checked before the turn is accepted: an error answer must mean "nothing accepted".
        wait = params.get("wait_s")
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int | float)):
            raise RequestError("bad_request", "wait_s: must be a number of seconds", field="wait_s")
        with anyio.CancelScope(shield=True):  # accepted means scheduled, client or not
            turn, created = await self._scheduler.submit(request)
        if wait is not None:
            # submit-and-wait in one round trip: answers once the turn is final or parked
            turn = await self._scheduler.wait_turn(turn.turn_id, timeout_s=float(wait))
        return {"turn": _turn(turn), "created": created}

    async def _turn_get(self, params: Mapping[str, Any]) -> object:
        return {"turn": _turn(await self._scheduler.get_turn(_turn_id(params)))}

    async def _turn_wait(self, params: Mapping[str, Any]) -> object:
        timeout = params.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float)
        ):
            raise RequestError(
                "bad_request", "timeout_s: must be a number of seconds", field="timeout_s"
            )
        until_value = params.get("until", [])
        try:
            until = frozenset(TurnState(v) for v in until_value)
        except (TypeError, ValueError):
            raise RequestError(
                "bad_request", "until: must be a list of turn states", field="until"
            ) from None
        turn = await self._scheduler.wait_turn(
            _turn_id(params),
            timeout_s=float(timeout) if timeout is not None else None,
            until=until,
        )
        return {"turn": _turn(turn)}

    async def _turn_cancel(self, params: Mapping[str, Any]) -> object:
        return {"turn": _turn(await self._scheduler.cancel_turn(_turn_id(params)))}

    async def _turns_list(self, params: Mapping[str, Any]) -> object:
        sid = _str(params, "session_id", required=False)
        turns = await self._scheduler.list_turns(session_id=sid)
        return {"turns": [_turn(t) for t in turns]}

    async def _status(self, params: Mapping[str, Any]) -> object:
        stats = self._scheduler.statistics()
        hub_stats = self._hub.statistics()
        counts = await self._scheduler.counts()
        return {
            "daemon": {"pid": os.getpid(), "draining": stats.draining, **self._info},
            "scheduler": stats.to_dict(),
            "intake": asdict(self._scheduler.intake_statistics()),
            "turns_by_state": counts,
            "in_flight": self._scheduler.in_flight(),
            "hub": _plain(asdict(hub_stats)),
            "executors": [_executor(i) for i in self._hub.list_executors()],
        }

    async def _executors_list(self, params: Mapping[str, Any]) -> object:
        return {"executors": [_executor(i) for i in self._hub.list_executors()]}

    async def _executors_wait(self, params: Mapping[str, Any]) -> object:
        """Wait until an executor is known with a status (default READY); for tools and tests."""
        from sandbox.policy.envelopes import ExecutorStatus

        executor_id = _str(params, "executor_id")
        status_value = params.get("status", "READY")
        try:
            status = None if status_value is None else ExecutorStatus(status_value)
        except ValueError:
            raise RequestError(
                "bad_request", f"status: not an executor status: {status_value!r}", field="status"
            ) from None
        timeout = params.get("timeout_s", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise RequestError("bad_request", "timeout_s: must be a number", field="timeout_s")
        with anyio.move_on_after(float(timeout)):
            info = await self._hub.wait_for_executor(executor_id, status=status)
            return {"executor": _executor(info)}
        raise RequestError(
            "timeout",
            f"executor {executor_id!r} did not reach {status_value} within {timeout} s",
            executor_id=executor_id,
        )

    async def _escalations_list(self, params: Mapping[str, Any]) -> object:
        return {"escalations": [_turn(t) for t in await self._scheduler.list_escalations()]}

    async def _escalations_resolve(self, params: Mapping[str, Any]) -> object:
        action = _str(params, "action")
        assert action is not None
        turn = await self._scheduler.resolve_escalation(_turn_id(params), action)
        return {"turn": _turn(turn)}

    async def _ledger_verify(self, params: Mapping[str, Any]) -> object:
        sid = _str(params, "session_id", required=False)
        return await self._scheduler.verify_ledgers(session_id=sid)

    async def _drain(self, params: Mapping[str, Any]) -> object:
        if self._on_drain is None:
            raise RequestError("bad_request", "drain: this server cannot be drained remotely")
        return {"draining": True}  # the drain starts once this answer is written


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [_plain(v) for v in value]
    enum_value = getattr(value, "value", None)
    if enum_value is not None and not isinstance(value, int | float | str | bool):
        return enum_value
    return value


def _executor(info: Any) -> dict[str, object]:
    data = _plain(asdict(info))
    assert isinstance(data, dict)
    return data
