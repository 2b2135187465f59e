"""Limits of the executor hub (the ``[executors]`` config section feeds these)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandbox.policy.breaker import BreakerLimits

__all__ = ["HubSettings", "queue_wait_limit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HubSettings:
    """Limits of the executor hub (the ``[executors]`` config section feeds these).

    ``allowed_uids``: peers (SO_PEERCRED) allowed to connect; ``None`` allows the daemon's own
    uid and root. ``queue_capacity`` bounds each command type's queue at admission.
    ``queue_wait_s`` bounds how long an attempt waits for a free executor (then TIMEOUT).
    ``cancel_grace_s``: how long an executor has to answer a ``cancel`` before it is marked
    ERROR. ``hello_timeout_s``: how long a new connection has to send ``hello``.
    """

    allowed_uids: frozenset[int] | None = None
    max_frame_bytes: int = 1_048_576
    heartbeat_interval_s: float = 5.0
    heartbeat_misses: int = 3
    queue_capacity: int = 1024
    queue_wait_s: float = 60.0
    quarantine_s: float = 300.0
    cancel_grace_s: float = 2.0
    hello_timeout_s: float = 5.0
    #: the circuit breaker of each command type's pool (``faults`` 0: off)
    breaker: BreakerLimits = field(default_factory=BreakerLimits)

    def __post_init__(self) -> None:
        checks = {
            "max_frame_bytes": self.max_frame_bytes >= 1024,
            "heartbeat_interval_s": self.heartbeat_interval_s > 0,
            "heartbeat_misses": self.heartbeat_misses >= 1,
            "queue_capacity": self.queue_capacity >= 1,
            "queue_wait_s": self.queue_wait_s > 0,
            "quarantine_s": self.quarantine_s >= 0,
            "cancel_grace_s": self.cancel_grace_s > 0,
            "hello_timeout_s": self.hello_timeout_s > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"HubSettings.{name} is out of range: {getattr(self, name)!r}")


def queue_wait_limit(limit_s: float, configured_s: float) -> str:
    """How long an attempt may wait for an executor, in the words every report of that wait
    uses (the submit warning, the attempt's detail): the limit in force, named by where it
    comes from: ``executors.queue_wait_s`` (*configured_s*), or the instruction's own
    ``timeout_ms`` when that is shorter (*limit_s*). How long it did wait is ``queued_ms``."""
    if limit_s < configured_s:
        return (
            f"limit {limit_s:g}s: the instruction's timeout_ms, below"
            f" executors.queue_wait_s={configured_s:g}s"
        )
    return f"limit executors.queue_wait_s={configured_s:g}s"
