"""What the executor hub reports: attempt reports, executor snapshots, statistics, reason codes.

Frozen values only; the hub's modules build them, callers (turns, ``hunter status``) read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorResponseEnvelope, ExecutorStatus

__all__ = ["AttemptReport", "ExecutorInfo", "HubReason", "HubStatistics"]


class HubReason:
    """``AttemptReport.safety_reason_code`` values for outcomes the hub decides itself.

    When the executor answered, the report carries the Phase-20 reason code of
    ``validate_executor_response`` instead (``RESPONSE_ACCEPTED``, ``SUCCESS_WITHOUT_EVIDENCE``...).
    """

    DEADLINE_EXCEEDED: Final = "DEADLINE_EXCEEDED"  # no answer by timeout_ms: TIMEOUT
    QUEUE_WAIT_EXPIRED: Final = "QUEUE_WAIT_EXPIRED"  # no executor free within queue_wait_s
    EXECUTOR_DISCONNECTED: Final = "EXECUTOR_DISCONNECTED"  # connection lost mid-instruction
    HEARTBEAT_LOST: Final = "HEARTBEAT_LOST"  # executor went silent: OFFLINE, CRASH
    FRAME_ERROR: Final = "FRAME_ERROR"  # oversized/undecodable frame instead of a response
    PROTOCOL_ERROR: Final = "PROTOCOL_ERROR"  # a well-framed message that breaks the protocol
    UNATTRIBUTABLE_RESPONSE: Final = "UNATTRIBUTABLE_RESPONSE"  # unknown id, several in flight
    EXECUTOR_QUARANTINED: Final = "EXECUTOR_QUARANTINED"  # another answer breached security
    HUB_CLOSED: Final = "HUB_CLOSED"  # the hub shut down while the attempt waited or ran


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What one attempt came to. ``outcome`` follows docs/policy.md ("How the seeds
    combine", item 4).

    ``executor_id`` is the executor the instruction was sent to (``None`` if it never left the
    queue); ``response`` the accepted response envelope (``None`` when denied or absent);
    ``safety_reason_code`` the Phase-20 reason code or a ``HubReason``; ``duration_ms`` runs from
    the attempt's start (``run_attempt`` being called, less its ``queued_before_ms``) to the
    outcome; ``queued_ms`` is the part spent waiting for a slot (before, then in the queue);
    ``evidence`` the evidence bytes sent with an accepted response (sha256 = its evidence_hash).
    """

    outcome: AttemptOutcome
    executor_id: str | None
    response: ExecutorResponseEnvelope | None
    safety_reason_code: str
    duration_ms: int
    detail: str
    queued_ms: int = 0
    evidence: bytes | None = None


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """A snapshot of one executor (connected, or recently disconnected: OFFLINE)."""

    executor_id: str
    status: ExecutorStatus
    commands: tuple[ExecutorCommandType, ...]
    slots: int
    in_flight: int
    uid: int | None
    pid: int | None
    connected_at_us: int
    quarantined_until_us: int | None
    software: str = ""
    detail: str = ""
    #: milliseconds since the executor's last frame (a heartbeat proves it alive; so does any
    #: answer); the connection is dropped past heartbeat_interval_s x heartbeat_misses
    heartbeat_age_ms: int | None = None


@dataclass(frozen=True, slots=True)
class HubStatistics:
    """Counters and gauges of the hub (``hunter status`` and logs use them)."""

    executors_connected: int
    executors_by_status: Mapping[str, int]
    queued_by_command: Mapping[str, int]
    in_flight: int
    attempts_started: int
    attempts_finished: int
    outcomes: Mapping[str, int]
    connections_rejected: int
    frame_errors: int
    late_responses: int
    quarantined: int
    #: circuit breakers not closed-and-quiet, by command type: ``state`` (closed, open,
    #: half_open), ``recent_faults``, ``probe_in_ms`` (open: time until a probe may go)
    circuits: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
