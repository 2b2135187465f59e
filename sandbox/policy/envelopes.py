"""Phase-20 closed enums and the two frozen envelopes (seed 001 sections 1-5).

Enum values are the member names as strings (``ExecutorCommandType.NAVIGATE.value ==
"NAVIGATE"``) so they go over the wire unchanged. Mapping fields are deep-frozen on
construction (dicts become read-only mappings, lists become tuples), so an envelope cannot be
changed after it has been validated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, unique
from types import MappingProxyType

__all__ = [
    "ExecutionSafetyResult",
    "ExecutorCommandType",
    "ExecutorInstructionEnvelope",
    "ExecutorResponseEnvelope",
    "ExecutorResponseType",
    "ExecutorStatus",
    "deep_freeze",
    "deep_thaw",
]

ParameterValue = str | int | bool


@unique
class ExecutorCommandType(Enum):
    """Commands an executor may be sent. CLOSED."""

    NAVIGATE = "NAVIGATE"
    CLICK = "CLICK"
    READ = "READ"
    SCROLL = "SCROLL"
    SCREENSHOT = "SCREENSHOT"
    EXTRACT = "EXTRACT"
    SHUTDOWN = "SHUTDOWN"


@unique
class ExecutorResponseType(Enum):
    """What an executor may answer. CLOSED."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    TIMEOUT = "TIMEOUT"
    ERROR = "ERROR"
    REFUSED = "REFUSED"


@unique
class ExecutorStatus(Enum):
    """Executor status values. CLOSED."""

    READY = "READY"
    BUSY = "BUSY"
    OFFLINE = "OFFLINE"
    ERROR = "ERROR"


def deep_freeze(value: object) -> object:
    """Return a read-only copy: mappings -> ``MappingProxyType``, lists/tuples -> tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: deep_freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(deep_freeze(item) for item in value)
    return value


def deep_thaw(value: object) -> object:
    """Inverse of ``deep_freeze`` for JSON encoding: mappings -> dicts, tuples -> lists."""
    if isinstance(value, Mapping):
        return {key: deep_thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [deep_thaw(item) for item in value]
    return value


def _frozen_mapping(value: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType({key: deep_freeze(item) for key, item in value.items()})


def _empty() -> Mapping[str, object]:
    return MappingProxyType({})


def _no_parameters() -> Mapping[str, ParameterValue]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ExecutorInstructionEnvelope:
    """One instruction for an executor; build it with ``build_executor_instruction``."""

    instruction_id: str
    execution_id: str
    command_type: ExecutorCommandType
    target_url: str
    target_selector: str
    timestamp: str
    timeout_ms: int
    parameters: Mapping[str, ParameterValue] = field(default_factory=_no_parameters)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))


@dataclass(frozen=True, slots=True)
class ExecutorResponseEnvelope:
    """An executor's answer after ``validate_executor_response`` accepted it."""

    instruction_id: str
    response_type: ExecutorResponseType
    evidence_hash: str
    error_message: str
    timestamp: str
    output: Mapping[str, object] = field(default_factory=_empty)
    partial: bool = False
    #: the executor's say on how long to wait before a retry (FAILURE/ERROR); None: no say
    retry_after_ms: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", _frozen_mapping(self.output))


@dataclass(frozen=True, slots=True)
class ExecutionSafetyResult:
    """Verdict of the Phase-20 safety rules (seed 001: ``validate_executor_response`` returns it).

    ``is_safe``, ``reason_code`` and ``reason_description`` are the seed authors' field names;
    ``response`` (the validated, frozen envelope) is set only when ``is_safe``.
    """

    is_safe: bool
    reason_code: str
    reason_description: str
    response: ExecutorResponseEnvelope | None = None
