# The sandbox runtime: sessions of an agent package, and the confined process turns run in them.
# May import `sandbox.policy`, `sandbox.confine`, the sandbox edge modules and `ledger`.
"""The sandbox runtime (sessions, confined process turns, realized writes, promotion)."""

from sandbox.runtime.session import DEFAULT_LOADER_PATHS as DEFAULT_LOADER_PATHS
from sandbox.runtime.session import DEFAULT_SYSTEM_READ_PATHS as DEFAULT_SYSTEM_READ_PATHS
from sandbox.runtime.session import AttemptRecord as AttemptRecord
from sandbox.runtime.session import DeclaredOutput as DeclaredOutput
from sandbox.runtime.session import Runtime as Runtime
from sandbox.runtime.session import RuntimeConfig as RuntimeConfig
from sandbox.runtime.session import Session as Session
from sandbox.runtime.session import TurnResult as TurnResult
from sandbox.runtime.session import TurnStatus as TurnStatus

__all__ = [
    "DEFAULT_LOADER_PATHS",
    "DEFAULT_SYSTEM_READ_PATHS",
    "AttemptRecord",
    "DeclaredOutput",
    "Runtime",
    "RuntimeConfig",
    "Session",
    "TurnResult",
    "TurnStatus",
]
