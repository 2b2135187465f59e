"""``turn.submit`` of an instruction turn without a task: the control API's hot path.

`QuickSubmits.take` hands a submission to the turn core's intake pass (`TurnCore.submit_soon`)
and answers it from a callback: at once, or once the turn settles for a ``wait_s``
(`TurnCore.settled_soon`; the wait's bound on the connection's timers). Only what needs to
await runs in a task: reading a turn from the store after it escalated, or when ``wait_s``
passed first. An idempotency key is looked up in the pass's transaction (a resubmission is
answered with the turn it names, ``created`` false). Everything else a client may send (another
kind of turn, a refusal) is served by a task, the way every other request is (`ControlServer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sandbox.policy.lifecycle import TurnKind
from supervisor.control.answers import turn_answer
from supervisor.control.replies import Replies
from supervisor.errors import RequestError
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.settings import queue_wait_limit
from supervisor.stages import stage_costs
from supervisor.store.protocol import TurnRecord
from supervisor.turns.core import TurnCore
from supervisor.turns.requests import TurnRequest, turn_request
from supervisor.wire.control import RequestId, TurnSubmit, TurnSubmitParams

__all__ = ["QuickSubmits", "submit_warnings"]

_COSTS = stage_costs()
_OP = "turn.submit"

#: The error answer of a request that raised (`ControlServer._failure`).
Failure = Callable[[RequestId, str, Exception], dict[str, object]]


def submit_warnings(
    hub: ExecutorHub,
    request: TurnRequest,
    peers: Callable[[], frozenset[str] | None] = lambda: None,
) -> list[str]:
    """What the client should know at once (the turn is accepted either way). *peers*: in a
    fleet, the command types the executors of the other live daemons serve
    (`TurnCore.served_by_peers`, asked only when no executor here serves the turn); a turn runs
    where they are (its session is handed over to one of them), so it is warned of only when
    no daemon of the fleet serves its type."""
    spec = request.instruction
    if spec is None or hub.serving(spec.command_type):
        return []
    command = spec.command_type.value
    served_by_peers = peers()
    if served_by_peers is not None and command in served_by_peers:
        return []
    queue_s = hub.settings.queue_wait_s
    limit = queue_wait_limit(min(queue_s, spec.timeout_ms / 1000), queue_s)
    nobody = (
        f"no connected executor serves {command}"
        if served_by_peers is None
        else f"no executor connected to any live daemon of the fleet serves {command}"
    )
    return [
        f"{nobody}: the turn waits for one ({limit}), then ends NO_CAPABLE_EXECUTOR;"
        " its attempt's queued_ms says how long it waited"
    ]


class QuickSubmits:
    """Submissions of instruction turns taken, and answered, without a task."""

    def __init__(self, turn_core: TurnCore, hub: ExecutorHub, failure: Failure) -> None:
        self._turn_core = turn_core
        self._hub = hub
        self._failure = failure

    def take(self, replies: Replies, request: TurnSubmit) -> bool:
        """Take the submission; False, with nothing done, when a task must serve it."""
        params = request.params
        if params.kind is not TurnKind.INSTRUCTION:
            return False
        started = _COSTS.clock()
        try:
            turn = turn_request(
                params, default_timeout_ms=self._turn_core.settings.default_timeout_ms
            )
        except RequestError:
            return False  # answered by the task, the same way as any refusal
        finally:
            _COSTS.add("admit", _COSTS.clock() - started)
        request_id = request.id
        # What the client should know at once, as of the submission (as the task path does).
        warnings = submit_warnings(self._hub, turn, self._turn_core.served_by_peers)

        def accepted(outcome: TurnRecord | Exception, created: bool) -> None:
            if isinstance(outcome, Exception):
                replies.send(self._failure(request_id, _OP, outcome), _OP)
            elif params.wait_s is None:
                replies.send(
                    self._answer(request_id, outcome, params, warnings, created=created), _OP
                )
            else:
                self._wait(replies, request_id, outcome.turn_id, params, warnings, created=created)

        try:
            taken = self._turn_core.submit_soon(turn, accepted)
        except Exception:  # queue_full, a store that closed: the task answers it alone
            return False
        if taken:
            replies.owed += 1
        return taken

    def _wait(
        self,
        replies: Replies,
        request_id: RequestId,
        turn_id: int,
        params: TurnSubmitParams,
        warnings: list[str],
        *,
        created: bool,
    ) -> None:
        """Answer when the turn settles, or when ``wait_s`` passes (with the turn as it is)."""
        timer: list[int] = []
        deadline = time.monotonic() + float(params.wait_s or 0.0)

        async def read_and_answer() -> None:
            try:
                record = await self._turn_core.get_turn(turn_id)
            except Exception as exc:
                replies.send(self._failure(request_id, _OP, exc), _OP)
                return
            replies.send(self._answer(request_id, record, params, warnings, created=created), _OP)

        async def wait_and_answer() -> None:
            # escalated (answered at once), or gone to another daemon of the fleet (a lost
            # claim, its session handed over): waited for there, for the rest of ``wait_s``
            try:
                record = await self._turn_core.wait_turn(
                    turn_id, timeout_s=max(0.0, deadline - time.monotonic())
                )
            except Exception as exc:
                replies.send(self._failure(request_id, _OP, exc), _OP)
                return
            replies.send(self._answer(request_id, record, params, warnings, created=created), _OP)

        def settled(final: TurnRecord | None) -> None:
            if timer:
                replies.timers.cancel(timer[0])
            if final is None:
                replies.spawn(wait_and_answer)
            else:
                replies.send(
                    self._answer(request_id, final, params, warnings, created=created), _OP
                )

        forget = self._turn_core.settled_soon(turn_id, settled)
        if forget is None:
            # A turn this submission created is watched here until it settles: it settled
            # already, read it. A turn its key named before may be settled, or run by another
            # daemon of a fleet, or be a turn this daemon took back at start: wait for it.
            replies.spawn(read_and_answer if created else wait_and_answer)
            return

        def timed_out() -> None:
            forget()
            replies.spawn(read_and_answer)

        timer.append(replies.timers.call_at(deadline, timed_out))

    def _answer(
        self,
        request_id: RequestId,
        record: TurnRecord,
        params: TurnSubmitParams,
        warnings: list[str],
        *,
        created: bool,
    ) -> dict[str, object]:
        started = _COSTS.clock()
        result: dict[str, object] = {
            "turn": turn_answer(record, params.answer),
            "created": created,
        }
        if warnings:
            result["warnings"] = warnings
        _COSTS.add("reply", _COSTS.clock() - started, 0)
        return {"id": request_id, "ok": True, "result": result}
