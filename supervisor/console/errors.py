"""The console's own errors (the daemon's refusals are the client library's exceptions)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ConsoleError", "OperatorsFileError"]


class ConsoleError(Exception):
    """Raised when the console cannot start as configured (the message says what to fix)."""


class OperatorsFileError(ConsoleError):
    """Raised when the operators file is missing, unreadable or wrong; ``path`` names it."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path
