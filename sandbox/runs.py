"""What a confined run of a process turn produced: `ProcessAttempt` (one attempt's record) and
`ConfinedRun` (the record, its outcome, its write surface and violations).

These results sit below both the sandbox runtime, which makes them (`sandbox.runtime.attempt`),
and the sandbox helper, which carries them over its socket (`sandbox.helper`), so that neither
of the two imports the other.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox.enumerate import RealizedWrite, SurfaceProblem, WriteSurface
from sandbox.errors import CapabilityViolation
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.faults import ExecutionFaultType

__all__ = ["ConfinedRun", "ProcessAttempt", "crashed_run", "ms_since"]


@dataclass(frozen=True, slots=True)
class ProcessAttempt:
    """One attempt of a process turn: how the confined run ended and what the policy decided.

    The runtime's detailed view (output text, realized writes, resource events); the daemon
    stores the one `sandbox.policy.attempt_record.AttemptRecord` made from it.
    """

    attempt_number: int
    exit_code: int | None
    signal: int | None
    timed_out: bool
    resource_exhausted: bool
    security_violation: bool
    outcome: str
    fault_type: str | None
    verdict: str
    reason_code: str
    reason: str
    delay_ms: int
    duration_ms: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    leftover_processes: int
    resource_events: Mapping[str, int]
    realized_writes: tuple[RealizedWrite, ...]
    problems: tuple[SurfaceProblem, ...]
    launcher: str
    #: wall-clock start of the attempt, microseconds since the epoch (0: not known)
    started_us: int = 0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (stdout/stderr as text; ledgers get hashes only)."""
        return {
            "attempt_number": self.attempt_number,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "resource_exhausted": self.resource_exhausted,
            "security_violation": self.security_violation,
            "outcome": self.outcome,
            "fault_type": self.fault_type,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "delay_ms": self.delay_ms,
            "duration_ms": self.duration_ms,
            "started_us": self.started_us,
            "finished_us": self.started_us + self.duration_ms * 1000 if self.started_us else 0,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "leftover_processes": self.leftover_processes,
            "resource_events": dict(self.resource_events),
            "realized_writes": [w.to_dict() for w in self.realized_writes],
            "problems": [p.to_dict() for p in self.problems],
            "launcher": self.launcher,
        }

    def ledger_summary(self) -> dict[str, object]:
        """The attempt as it goes into the exec ledger (no output text, only hashes)."""
        data = self.to_dict()
        for key in ("stdout", "stderr"):
            text = data.pop(key)
            assert isinstance(text, str)
            data[f"{key}_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        data.pop("realized_writes")
        return data


@dataclass(frozen=True, slots=True)
class ConfinedRun:
    """What one confined run produced: its record (no decision yet), outcome, write surface, and
    the capability violations found in it (undeclared, missing or special files)."""

    record: ProcessAttempt
    outcome: AttemptOutcome
    surface: WriteSurface
    violations: list[CapabilityViolation]


def ms_since(start_ns: int) -> int:
    """Milliseconds since *start_ns* on the monotonic clock."""
    return (time.monotonic_ns() - start_ns) // 1_000_000


def crashed_run(
    message: str, stderr: str, attempt_no: int, start_ns: int, launcher: str
) -> ConfinedRun:
    """A run that never got to run the command, or whose outcome was lost: a CRASH fault (the
    attempt loop retries it); *stderr* is what the attempt's record shows."""
    outcome = AttemptOutcome.fault(ExecutionFaultType.CRASH, message)
    record = ProcessAttempt(
        attempt_number=attempt_no,
        exit_code=None,
        signal=None,
        timed_out=False,
        resource_exhausted=False,
        security_violation=False,
        outcome=outcome.kind.value,
        fault_type=ExecutionFaultType.CRASH.value,
        verdict="",
        reason_code="",
        reason="",
        delay_ms=0,
        duration_ms=ms_since(start_ns),
        started_us=time.time_ns() // 1000 - ms_since(start_ns) * 1000,
        stdout="",
        stderr=stderr,
        stdout_truncated=False,
        stderr_truncated=False,
        leftover_processes=0,
        resource_events={},
        realized_writes=(),
        problems=(),
        launcher=launcher,
    )
    return ConfinedRun(record, outcome, WriteSurface((), ()), [])
