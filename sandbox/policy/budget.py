"""The daemon-wide retry budget: retries at most a fraction of recent first attempts.

A retry storm (every executor of a pool failing, every turn retrying) multiplies the load on the
pool exactly when it can least take it. The budget caps retries over a sliding window: at any
moment, the retries granted in the last ``window_ms`` may not exceed ``min_retries + ratio x
first attempts`` in the same window (Finagle's ``RetryBudget`` and gRPC's retry throttling are the
models: a percentage of the traffic, plus a small allowance so a quiet daemon can still retry).
A retry over budget is not scheduled: the turn ends with ``DAEMON_RETRY_BUDGET_EXHAUSTED``
(`over_budget`; see docs/policy.md "The retry budget").

Pure arithmetic: no I/O and no clock reads. Times are integer milliseconds passed in by the
caller (a monotonic clock); the limits are passed on every call, so a configuration reload
applies at once and the counts stay. Events are counted in buckets of ``RESOLUTION_MS``; a bucket
belongs to the window while its start is later than ``now - window_ms``, so the window is exact
to one bucket, and memory is ``window_ms / RESOLUTION_MS`` buckets whatever the traffic.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Final

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import AttemptDecision, Verdict

__all__ = [
    "RESOLUTION_MS",
    "BudgetLimits",
    "BudgetStatistics",
    "RetryBudget",
    "over_budget",
]

#: The width of one counting bucket.
RESOLUTION_MS: Final = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetLimits:
    """``ratio``: retries allowed per first attempt in the window; ``window_ms``: the sliding
    window (0: no budget, every retry is granted); ``min_retries``: retries allowed in any
    window whatever the traffic.

    Raises ``ValueError`` for a window between 0 and ``RESOLUTION_MS``, a negative allowance,
    or a ratio that is negative or not finite.
    """

    ratio: float = 0.2
    window_ms: int = 10_000
    min_retries: int = 100

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio >= 0):
            msg = f"ratio must be a finite number >= 0, got {self.ratio!r}"
            raise ValueError(msg)
        if self.window_ms != 0 and self.window_ms < RESOLUTION_MS:
            msg = f"window_ms must be 0 (off) or >= {RESOLUTION_MS}, got {self.window_ms}"
            raise ValueError(msg)
        if self.min_retries < 0:
            msg = f"min_retries must be >= 0, got {self.min_retries}"
            raise ValueError(msg)

    @property
    def enabled(self) -> bool:
        """False when ``window_ms`` is 0: every retry is granted."""
        return self.window_ms > 0

    def allowance(self, first_attempts: int) -> int:
        """Retries allowed in a window that saw *first_attempts*."""
        return self.min_retries + math.floor(self.ratio * first_attempts)


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """A snapshot: first attempts and granted retries in the window, the allowance, and the
    retries refused since the start."""

    first_attempts: int
    retries: int
    allowance: int
    refused_total: int
    enabled: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "first_attempts": self.first_attempts,
            "retries": self.retries,
            "allowance": self.allowance,
            "refused_total": self.refused_total,
        }


class RetryBudget:
    """Counts first attempts and granted retries over a sliding window (see the module)."""

    __slots__ = ("_buckets", "_first", "_latest", "_refused", "_retries")

    def __init__(self) -> None:
        # [bucket index, first attempts, retries], oldest first
        self._buckets: collections.deque[list[int]] = collections.deque()
        self._first = 0
        self._retries = 0
        self._refused = 0
        self._latest = 0

    def _advance(self, now_ms: int, limits: BudgetLimits) -> list[int]:
        """Drop buckets that left the window; the bucket of *now_ms* (a clock that steps back
        counts in the latest bucket)."""
        now_ms = max(now_ms, self._latest)
        self._latest = now_ms
        oldest = (now_ms - limits.window_ms) // RESOLUTION_MS  # buckets <= this have left
        buckets = self._buckets
        while buckets and buckets[0][0] <= oldest:
            _, first, retries = buckets.popleft()
            self._first -= first
            self._retries -= retries
        index = now_ms // RESOLUTION_MS
        if not buckets or buckets[-1][0] != index:
            buckets.append([index, 0, 0])
        return buckets[-1]

    def first_attempt(self, now_ms: int, limits: BudgetLimits) -> None:
        """A turn's first attempt started at *now_ms*: it earns ``ratio`` retries."""
        self._advance(now_ms, limits)[1] += 1
        self._first += 1

    def try_retry(self, now_ms: int, limits: BudgetLimits) -> bool:
        """Grant (and count) a retry at *now_ms*, or refuse it: False when the window's
        retries already reach its allowance."""
        bucket = self._advance(now_ms, limits)
        if limits.enabled and self._retries + 1 > limits.allowance(self._first):
            self._refused += 1
            return False
        bucket[2] += 1
        self._retries += 1
        return True

    def statistics(self, now_ms: int, limits: BudgetLimits) -> BudgetStatistics:
        self._advance(now_ms, limits)
        return BudgetStatistics(
            first_attempts=self._first,
            retries=self._retries,
            allowance=limits.allowance(self._first),
            refused_total=self._refused,
            enabled=limits.enabled,
        )


def over_budget(decision: AttemptDecision) -> AttemptDecision:
    """The ending of a turn whose RETRY *decision* the budget refused: TERMINATE with
    ``DAEMON_RETRY_BUDGET_EXHAUSTED`` (the engine's answer stays on the record)."""
    return AttemptDecision(
        Verdict.TERMINATE,
        rc.DAEMON_RETRY_BUDGET_EXHAUSTED,
        f"{decision.reason}; but the daemon's retry budget is spent (too many retries for the "
        "recent first attempts): not retried",
        fault_type=decision.fault_type,
        sandbox_decision=decision.sandbox_decision,
        retry_policy=decision.retry_policy,
    )
