"""``turn.submit`` (served by a task: `supervisor.control.submits` takes the rest without one),
``turn.get``, ``turn.evidence``, ``turn.wait``, ``turn.cancel`` and ``turns.list``: the turns of
the turn core, with their ledger entries and evidence bytes read from the session's files."""

from __future__ import annotations

import functools
from typing import Final

import anyio
import anyio.to_thread

from ledger import session_dir_for
from supervisor.control.answers import (
    EvidenceMissing,
    evidence_slice,
    turn_answer,
)
from supervisor.control.operations.attribution import caller_decision
from supervisor.control.submits import submit_warnings
from supervisor.control.turn_entries import turn_ledger_entries
from supervisor.errors import RequestError
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.peercred import PeerCredentials
from supervisor.stages import stage_costs
from supervisor.store.protocol import TurnRecord
from supervisor.turns.core import TurnCore
from supervisor.turns.requests import turn_request
from supervisor.wire.control import (
    TurnCancelParams,
    TurnEvidenceParams,
    TurnRef,
    TurnsListParams,
    TurnSubmitParams,
    TurnWaitParams,
)

__all__ = ["TurnOperations"]

_COSTS: Final = stage_costs()


class TurnOperations:
    """The turn operations of one `TurnCore`; *hub*: to warn of a command type no executor
    serves."""

    def __init__(self, turn_core: TurnCore, hub: ExecutorHub) -> None:
        self._turn_core = turn_core
        self._hub = hub

    async def submit(self, params: TurnSubmitParams) -> object:
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

    async def get(self, params: TurnRef) -> object:
        turn = await self._turn_core.get_turn(params.id)
        return {"turn": turn_answer(turn), "ledger": await self._ledger(turn)}

    async def _ledger(self, turn: TurnRecord) -> dict[str, list[dict[str, object]]]:
        """The turn's entries in its session's exec and evidence ledger files (read only)."""
        try:
            session = await self._turn_core.get_session(turn.session_id)
        except RequestError:
            return {"exec": [], "evidence": []}
        session_dir = session_dir_for(
            self._turn_core.settings.root, session.tier, session.session_id
        )
        return await anyio.to_thread.run_sync(
            turn_ledger_entries, session_dir, turn.turn_number, turn.accepted_us
        )

    async def evidence(self, params: TurnEvidenceParams) -> object:
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

    async def wait(self, params: TurnWaitParams) -> object:
        timeout = params.timeout_s
        until = params.until
        turn = await self._turn_core.wait_turn(
            params.id,
            timeout_s=float(timeout) if timeout is not None else None,
            until=until,
        )
        if params.answer == "record":  # what turn.get answers, without a second round trip
            return {"turn": turn_answer(turn), "ledger": await self._ledger(turn)}
        return {"turn": turn_answer(turn, params.answer)}

    async def cancel(self, params: TurnCancelParams, peer: PeerCredentials | None) -> object:
        """A decision, attributed to *peer*."""
        decision = await caller_decision("cancel", peer, params.operator, params.reason)
        return {"turn": turn_answer(await self._turn_core.cancel_turn(params.id, decision))}

    async def list_turns(self, params: TurnsListParams) -> object:
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
