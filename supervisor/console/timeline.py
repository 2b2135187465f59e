"""A turn's decision record drawn as a timeline: what happened to it, in order, with the reason
codes, the queue waits and the backoffs between attempts. Pure: a `supervisor.client.Turn` in,
frozen rows out (the turn page renders them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from supervisor.client import Attempt, Turn

__all__ = ["Step", "timeline"]

StepKind = Literal["accepted", "queued", "attempt", "decision", "backoff", "ended", "waiting"]


@dataclass(frozen=True, slots=True)
class Step:
    """One row of the timeline."""

    kind: StepKind
    at_us: int | None
    title: str
    detail: str = ""
    #: the policy's reason code of a decision, an attempt's fault type
    code: str | None = None
    #: how long the step lasted (a queue wait, a run, a backoff), in milliseconds
    ms: int | None = None
    #: "ok", "bad" or "wait": the row's colour
    tone: str = ""


def timeline(turn: Turn) -> list[Step]:
    """The rows of *turn*'s timeline, oldest first."""
    steps = [Step("accepted", turn.accepted_us, "accepted", f"{turn.kind or 'turn'} turn")]
    for attempt in turn.attempts:
        steps.extend(_attempt_steps(attempt))
    if turn.final:
        steps.append(
            Step(
                "ended",
                turn.finished_us,
                turn.state,
                turn.reason or "",
                code=turn.reason_code,
                tone="ok" if turn.state == "succeeded" else "bad",
            )
        )
    elif turn.state == "escalated":
        steps.append(
            Step(
                "waiting",
                turn.updated_us,
                "escalated: waiting for an operator",
                turn.reason or "",
                code=turn.reason_code,
                tone="wait",
            )
        )
    elif turn.state == "waiting_retry":
        steps.append(Step("waiting", turn.next_attempt_us, "next attempt", tone="wait"))
    else:
        steps.append(Step("waiting", turn.updated_us, turn.state, tone="wait"))
    return steps


def _attempt_steps(attempt: Attempt) -> list[Step]:
    steps: list[Step] = []
    queued = attempt.extra.get("queued_ms")
    if isinstance(queued, int) and queued > 0:
        steps.append(
            Step("queued", None, f"attempt {attempt.attempt} waited", "for a free slot", ms=queued)
        )
    who = f" on {attempt.executor_id}" if attempt.executor_id else ""
    outcome = attempt.outcome or "running"
    steps.append(
        Step(
            "attempt",
            attempt.started_us,
            f"attempt {attempt.attempt}{who}",
            outcome if attempt.detail is None else f"{outcome}: {attempt.detail}",
            code=attempt.fault_type,
            ms=attempt.duration_ms,
            tone="ok" if outcome == "SUCCESS" else ("" if outcome == "running" else "bad"),
        )
    )
    if attempt.decision is not None:
        steps.append(
            Step(
                "decision",
                attempt.finished_us,
                f"decision: {attempt.decision}",
                attempt.reason or "",
                code=attempt.reason_code,
                tone="wait" if attempt.decision in {"RETRY", "ESCALATE"} else "",
            )
        )
    if attempt.decision == "RETRY" and attempt.delay_ms:
        steps.append(Step("backoff", attempt.finished_us, "backoff", ms=attempt.delay_ms))
    return steps
