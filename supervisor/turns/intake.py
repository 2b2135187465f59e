"""The intake pass: submissions taken without a task, their accepts committed together.

`TurnCore.submit` serves a submission in the caller's task, with every check a turn may need
(a process turn's capabilities checked on a thread, a fleet's session homed elsewhere). The
common case needs none of that: an instruction turn of a session this daemon holds, with or
without an idempotency key. `Intake.submit_soon` takes it without a task: the intake rules and
the queue's backpressure apply at once, and its accept is queued (`TurnStore.accept_soon`) with
the others of the pass, which commit in one transaction; a key is looked up in that transaction
(the store's accept returns the turn it already names). When the store is done with it, a
callback (on the event loop, in the store's committer) starts the accepted turn
(`runner.TurnRunner.start`) and calls the submitter's *answer* with the turn and whether it was
created, or with the error (`idempotency_conflict` for a key reused with another payload).
`run` only marks the span in which the turn core runs.

`SessionGate` is what a submission and a session's close share: each refuses while the other
is under way, so no turn lands in a closed session.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import anyio

from supervisor.errors import RequestError, SessionClosedError
from supervisor.logging import get_logger, info_enabled
from supervisor.stages import stage_costs
from supervisor.store.protocol import Accepted, Claim, NewTurn, PendingWrite, TurnRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.requests import TurnRequest, idempotency_conflict

__all__ = ["Answer", "Intake", "SessionGate"]

#: How `Intake.submit_soon` answers: the accepted turn (and False when its idempotency key named
#: a turn accepted before: that turn), or the error.
Answer = Callable[[TurnRecord | Exception, bool], None]

_COSTS = stage_costs()


class SessionGate:
    """Submissions under way per session, and the sessions being closed."""

    __slots__ = ("_submitting", "closing")

    def __init__(self) -> None:
        self._submitting: dict[str, int] = {}
        self.closing: set[str] = set()

    def enter(self, session_id: str) -> None:
        self._submitting[session_id] = self._submitting.get(session_id, 0) + 1

    def leave(self, session_id: str) -> None:
        self._submitting[session_id] -= 1
        if not self._submitting[session_id]:
            del self._submitting[session_id]

    def submitting(self, session_id: str) -> int:
        return self._submitting.get(session_id, 0)


class Intake:
    """Submissions taken without a task, and the pass that accepts them."""

    def __init__(
        self,
        deps: TurnDeps,
        gate: SessionGate,
        *,
        admit: Callable[[TurnRequest], None],
        start: Callable[[TurnRecord, Claim], None],
    ) -> None:
        self._deps = deps
        self._gate = gate
        self._admit = admit
        self._start = start
        self._log = get_logger("supervisor.turns")
        # False while the turn core does not run: `submit` is used then.
        self._running = False

    def submit_soon(self, request: TurnRequest, answer: Answer) -> bool:
        """Take *request* for the next pass; *answer* is called with the accepted turn or
        the error (`RequestError` for what a client should read). False, with nothing done,
        when the request needs `TurnCore.submit`. Raises `RequestError` (queue_full) as
        `submit` does."""
        deps = self._deps
        sid = request.session_id
        if (
            not self._running
            or deps.draining
            or request.instruction is None
            or sid in self._gate.closing
            or deps.sessions.get(sid) is None
        ):
            return False
        started = _COSTS.clock()
        self._admit(request)
        pending = deps.store.accept_soon(
            NewTurn(session_id=sid, spec=request.spec, idempotency_key=request.idempotency_key),
            claim_for=deps.owner,
            lease_ms=deps.settings.lease_ms,
        )
        self._gate.enter(sid)
        pending.when_done(functools.partial(self._accepted, request, pending, answer))
        _COSTS.add("admit", _COSTS.clock() - started, 0)
        return True

    async def run(self) -> None:
        """While the turn core runs: submissions are taken (their callbacks need it)."""
        self._running = True
        try:
            await anyio.sleep_forever()
        finally:
            self._running = False

    def _accepted(
        self, request: TurnRequest, pending: PendingWrite[Accepted], answer: Answer
    ) -> None:
        """The store is done with the accept: start the turn, answer the submitter."""
        sid = request.session_id
        outcome: TurnRecord | Exception
        created = True
        try:
            accepted = pending.outcome()
        except SessionClosedError:
            outcome = RequestError(
                "session_closed", f"session {sid} is closed; open a new one", session_id=sid
            )
        except Exception as exc:  # the submitter answers it (a store error, a bug)
            outcome = exc
        else:
            outcome = accepted.turn
            created = accepted.created
            if not created:  # the key named a turn accepted before: the same turn asked for?
                outcome = idempotency_conflict(request, accepted.turn) or accepted.turn
            elif accepted.claim is not None:
                self._deps.tracker.accepted(accepted.turn)  # before its first attempt starts
                if self._running:  # else the core stopped: a restart takes the turn back
                    self._start(accepted.turn, accepted.claim)
            if created and info_enabled():
                self._log.info(
                    "turn_accepted",
                    session_id=sid,
                    turn_number=accepted.turn.turn_number,
                    turn_id=accepted.turn.turn_id,
                    kind=accepted.turn.kind.value,
                )
        finally:
            self._gate.leave(sid)
        try:
            answer(outcome, created)
        except Exception:  # the submitter's own bug: logged, the pass goes on
            self._log.exception("submit_answer_failed", session_id=sid)
