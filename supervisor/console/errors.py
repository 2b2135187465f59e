"""The console's own errors (the daemon's refusals are the client library's exceptions)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BadId", "ConsoleError", "OperatorsFileError"]


class ConsoleError(Exception):
    """Raised when the console cannot start as configured (the message says what to fix)."""


class OperatorsFileError(ConsoleError):
    """Raised when the operators file is missing, unreadable or wrong; ``path`` names it."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class BadId(Exception):
    """Raised by `supervisor.console.ids` for an id from a request that nothing of the daemon
    can have (a turn id past 64 bits, a session id not of the daemon's form), before the daemon
    is asked. ``field`` names where it came from; ``in_path``: in the URL's path, so the page
    answers 404 (no such thing), else in a query parameter or form field (400)."""

    def __init__(self, message: str, *, field: str, in_path: bool) -> None:
        super().__init__(message)
        self.field = field
        self.in_path = in_path

    @property
    def status(self) -> int:
        """The HTTP status that answers it: 404 for a path, 400 for a parameter."""
        return 404 if self.in_path else 400
