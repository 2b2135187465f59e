# The sandbox runtime: sessions of an agent package, and the confined process turns run in them.
# May import `sandbox.policy`, `sandbox.confine`, the sandbox edge modules and `ledger`.
# runtime.py (Runtime: probe, uid pool, open/resume) -> session.py (Session) -> area.py (dirs,
# uid, ruleset, cgroup), process_turn.py (the attempt loop; its request_checks, turn_progress,
# promotion, turn_ledger and turn_result) -> attempt.py (one confined run). No module imports one
# above it: they see the runtime through view.RuntimeView (config.py holds RuntimeConfig) and the
# session and area through the Protocols of process_turn and attempt (tests/test_import_circles.py).
"""The sandbox runtime (sessions, confined process turns, realized writes, promotion)."""

from sandbox.policy.declarations import DeclaredOutput as DeclaredOutput
from sandbox.runs import ProcessAttempt as ProcessAttempt
from sandbox.runtime.process_turn import TurnResult as TurnResult
from sandbox.runtime.process_turn import TurnStatus as TurnStatus
from sandbox.runtime.runtime import DEFAULT_LOADER_PATHS as DEFAULT_LOADER_PATHS
from sandbox.runtime.runtime import DEFAULT_SYSTEM_READ_PATHS as DEFAULT_SYSTEM_READ_PATHS
from sandbox.runtime.runtime import Runtime as Runtime
from sandbox.runtime.runtime import RuntimeConfig as RuntimeConfig
from sandbox.runtime.session import Session as Session

__all__ = [
    "DEFAULT_LOADER_PATHS",
    "DEFAULT_SYSTEM_READ_PATHS",
    "DeclaredOutput",
    "ProcessAttempt",
    "Runtime",
    "RuntimeConfig",
    "Session",
    "TurnResult",
    "TurnStatus",
]
