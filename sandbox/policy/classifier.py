"""Seed 003 exit-code classes: transient (retry without blame) vs persistent (the agent's).

A pure, stateless utility. Exit codes 124-128 are transient (124 is the ``timeout`` command's
network/deadline code, 125 the container daemon being unavailable, 126-128 OS-level trouble
starting the command); a negative code (a process killed by a signal, as ``subprocess`` reports
it) is transient too. Every other non-zero code is persistent. Zero is success, not an error.
"""

from __future__ import annotations

from enum import Enum, unique
from typing import Final

from sandbox.policy.faults import ExecutionFaultType

__all__ = [
    "EXIT_COMPILATION_ERROR",
    "EXIT_DOCKER_DAEMON_UNAVAILABLE",
    "EXIT_NETWORK_TIMEOUT",
    "TRANSIENT_EXIT_CODES",
    "ErrorClass",
    "ErrorClassifier",
]

EXIT_NETWORK_TIMEOUT: Final = 124
EXIT_DOCKER_DAEMON_UNAVAILABLE: Final = 125
EXIT_COMPILATION_ERROR: Final = 1
#: Exit codes classified as transient (126-128: cannot execute, not found, invalid exit).
TRANSIENT_EXIT_CODES: Final = frozenset({124, 125, 126, 127, 128})


@unique
class ErrorClass(Enum):
    """Seed 003's two error classes (values are the seed's names)."""

    TRANSIENT = "TransientError"
    PERSISTENT = "PersistentError"


class ErrorClassifier:
    """Classify a failed attempt's exit code; stateless, all static methods."""

    __slots__ = ()

    @staticmethod
    def classify(exit_code: int) -> ErrorClass:
        """Return TRANSIENT for 124-128 and negative (signal) codes, PERSISTENT otherwise.

        Raises ``TypeError`` for a non-int and ``ValueError`` for 0 (a success has no class).
        """
        if type(exit_code) is not int:
            msg = f"exit code must be an int, got {type(exit_code).__name__}"
            raise TypeError(msg)
        if exit_code == 0:
            msg = "exit code 0 is a success, not an error"
            raise ValueError(msg)
        if exit_code < 0 or exit_code in TRANSIENT_EXIT_CODES:
            return ErrorClass.TRANSIENT
        return ErrorClass.PERSISTENT

    @staticmethod
    def fault_type(exit_code: int) -> ExecutionFaultType | None:
        """The Phase-21 fault a transient exit code stands for: 124 TIMEOUT, 125-128/<0 CRASH.

        ``None`` for a persistent code (it is a plain failure, not a fault).
        """
        if ErrorClassifier.classify(exit_code) is ErrorClass.PERSISTENT:
            return None
        if exit_code == EXIT_NETWORK_TIMEOUT:
            return ExecutionFaultType.TIMEOUT
        return ExecutionFaultType.CRASH
