"""Process turns: the sandbox runtime runs them in the session's confined area.

The runtime runs the turn's attempts through the one attempt loop itself (each attempt is a
confined run; the loop retries with backoff) and writes both ledger entries in one sync. This
module takes the session's lock (process turns of one session share its sandbox directories)
and a process slot, notes the first attempt's start (written, moving the turn to ``running``,
once the attempt outlives a short delay; a quicker one's start rides with the ending:
`starts.DeferredStarts`), and stores how it ended. The time it waited for the lock and the
slot is the first attempt's queue wait (``queued_ms``).

After a restart, an attempt whose start was written is decided first as a CRASH (the loop's
``interrupted``); if the policy retries it, the runtime gets the rest of the attempt budget and
numbers its attempts on from the interrupted one (``first_attempt``), so the runtime's log
events and ledger entries give each attempt the number the turn's records give it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import anyio
import msgspec

from ledger.pending import PendingLines
from sandbox.policy.attempt_loop import AttemptReport, run_attempts
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import ClaimLostError
from supervisor.store.protocol import TurnEnding, TurnRecord
from supervisor.turns.context import (
    LoopHooks,
    TurnDeps,
    end_turn,
    lease_gate,
    now_us,
    waited_ms,
)
from supervisor.turns.sessions import ProcessResultLike
from supervisor.turns.tracker import ActiveTurn
from supervisor.wire.turn_spec import ProcessSpec, RequestedBy

__all__ = ["run_process_turn"]


async def _never(attempt: AttemptRecord) -> AttemptReport[None]:
    msg = "the recovery pass runs no attempt"  # should_continue is False there
    raise AssertionError(msg)


def _text(value: object) -> str | None:
    if value is None:
        return None
    name = getattr(value, "value", value)
    return str(name)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _records(result: ProcessResultLike, first: int, started_us: int) -> tuple[AttemptRecord, ...]:
    """The runtime's attempts as the store's records, numbered within the turn's budget."""
    out: list[AttemptRecord] = []
    finished = now_us()
    for i, attempt in enumerate(result.attempts):
        data: Mapping[str, object] = attempt.to_dict()
        extra = {
            k: data[k]
            for k in ("signal", "timed_out", "resource_exhausted", "security_violation", "launcher")
            if k in data
        }
        began = _int(data.get("started_us")) or started_us
        ended = _int(data.get("finished_us")) or finished
        out.append(
            AttemptRecord(
                attempt=first + i,
                started_us=began,
                finished_us=ended,
                outcome=_text(data.get("outcome")),
                fault_type=_text(data.get("fault_type")),
                exit_code=_int(data.get("exit_code")),
                decision=_text(data.get("verdict")),
                reason_code=_text(data.get("reason_code")),
                reason=_text(data.get("reason")),
                detail=_text(data.get("detail")),
                duration_ms=_int(data.get("duration_ms")),
                delay_ms=_int(data.get("delay_ms")),
                extra=extra,
            )
        )
    if not out:
        out.append(
            AttemptRecord(
                attempt=first,
                started_us=started_us,
                finished_us=finished,
                fault_type=_text(result.fault_type),
                decision=_text(result.verdict),
                reason_code=result.reason_code,
                reason=result.reason,
            )
        )
    return tuple(out)


def _state(status: str) -> TurnState:
    try:
        return TurnState(status)
    except ValueError:
        return TurnState.TERMINATED


async def run_process_turn(
    deps: TurnDeps,
    turn: TurnRecord,
    active: ActiveTurn,
    process: ProcessSpec,
    *,
    interrupted: AttemptRecord | None,
) -> TurnRecord | None:
    """Run the turn to its ending; None when a drain stopped it before it started."""
    session = deps.sessions.get(turn.session_id)
    if session is None:  # dropped here (in a fleet: its home moved)
        raise ClaimLostError(
            turn.turn_id, reason=f"its session {turn.session_id} is not loaded here"
        )
    options = deps.settings.retry
    # The first attempt's start is only noted: written if the attempt outlives a short delay,
    # else it rides with the ending (`starts.DeferredStarts`: one commit a turn fewer).
    hooks = LoopHooks(deps, active, process=True, overlap_start=True)
    used = 0
    if interrupted is not None:
        end = await run_attempts(
            _never,
            phase=process.phase,
            options=options,
            clock=now_us,
            sleep=anyio.sleep,
            hooks=hooks,
            interrupted=interrupted,
            execution_id=f"EXE-{turn.turn_id}",
            instruction_id=lambda n: f"INS-{turn.turn_id}-{n}",
            should_continue=lambda: False,
        )
        if end is not None:
            last = end.attempts[-1]
            hooks.log_fault(last)
            ending = TurnEnding(
                state=end.state,
                verdict=end.decision.verdict.name,
                reason_code=end.decision.reason_code,
                reason=end.decision.reason,
                fault_type=None if end.outcome.fault_type is None else end.outcome.fault_type.value,
            )
            # The runtime never saw this ending: the daemon writes the ledger entries.
            return await end_turn(deps, turn, active, ending, [last])
        # the rest of the turn's budget: the runtime numbers its attempts on from this one
        used = interrupted.attempt
    else:
        used = turn.attempt
        if used:  # run again (an operator's retry): a whole budget, numbered on
            options = dataclasses.replace(options, max_attempts=used + options.max_attempts)
    async with deps.sessions.lock(turn.session_id), deps.process_limiter:
        if deps.draining:
            return None
        first = used + 1
        started_us = now_us()
        # Waited for the session's lock (its process turns run one at a time) and a slot.
        queued_ms = waited_ms(active.ready_at)
        deps.tracker.attempt_queued("process", queued_ms)  # the metric's command_type
        try:
            await hooks.attempt_started(
                AttemptRecord(attempt=first, started_us=started_us).with_queued_ms(queued_ms)
            )
            ended: list[TurnRecord] = []

            async def commit(result: ProcessResultLike) -> None:
                """The ending, with both ledger entries the runtime made (a rejection's too),
                in one durable step; the runtime places the outputs only after it."""
                records = _records(result, first, started_us)
                asked = process.requested_by  # who asked, through a front end (`hunter mcp`)
                pending = result.pending_lines
                if isinstance(asked, RequestedBy) and isinstance(pending, PendingLines):
                    pending.add_fields("evidence", {"requested_by": msgspec.structs.asdict(asked)})
                # The runtime's retries keep the lock and the slot: they wait for neither.
                records = tuple(
                    r.with_queued_ms(0 if r.attempt > first else queued_ms) for r in records
                )
                for _ in records[1:]:
                    deps.tracker.attempt_queued("process", 0)
                ending = TurnEnding(
                    state=_state(str(result.status)),
                    verdict=_text(result.verdict),
                    reason_code=result.reason_code,
                    reason=result.reason,
                    fault_type=_text(result.fault_type),
                    result={str(k): v for k, v in result.to_dict().items()},
                )
                for record in records:
                    hooks.log_fault(record)
                # a start written meanwhile must have committed (a refused one raises here);
                # one not written yet rides with the ending
                await hooks.commit_start()
                ended.append(
                    await end_turn(
                        deps,
                        turn,
                        active,
                        ending,
                        records,
                        pending=result.pending_lines,
                        started=hooks.take_unwritten_start(),
                    )
                )

            result = await session.run_process_turn(
                list(process.argv),
                declared_outputs=[d.to_dict() for d in process.declared_outputs],
                declared_inputs=list(process.declared_inputs),
                phase=process.phase,
                timeout_ms=process.timeout_ms,
                turn_number=turn.turn_number,
                options=options,
                ledger_commit="caller",
                first_attempt=first,
                # each retry waits for a live lease and refuses to go on without the claim
                delay=functools.partial(_backoff, deps, active),
                # the ending commits before the outputs reach the workspace (a refused ending
                # never does); where the area cannot stage, the lease is checked before
                commit=commit,
                before_promote=functools.partial(lease_gate, deps, active),
            )
            if not ended:  # rejected before it ran: the runtime made the entries, no commit
                await commit(result)
            return ended[0]
        except Exception:
            await hooks.commit_start()  # written, or taken back: the error ends the turn
            raise
        except BaseException:  # cancelled: a start not written yet never is
            hooks.forget_start()
            raise
        finally:
            hooks.stop_counting()


async def _backoff(deps: TurnDeps, active: ActiveTurn, seconds: float) -> None:
    """A retry's backoff between a process turn's attempts (the sandbox runtime's delay): then
    the lease gate, so that the next attempt never starts without the claim and the home."""
    await anyio.sleep(seconds)
    await lease_gate(deps, active)
