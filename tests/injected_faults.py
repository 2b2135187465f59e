"""The unforeseen exceptions the error-boundary tests inject into each socket's handler, and
the mark that picks the one request whose handling fails (the other connections go on)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FAULTS", "FAULT_IDS", "MARK", "Unforeseen"]

#: what marks the one request whose handling fails
MARK = b"BOOM"


class Unforeseen(Exception):
    """An exception type no handler knows about."""


#: the unforeseen exceptions injected (each test runs with every one)
FAULTS: list[Callable[[], Exception]] = [
    lambda: RuntimeError("injected"),
    lambda: KeyError("injected"),
    lambda: Unforeseen("injected"),
]
FAULT_IDS = ["RuntimeError", "KeyError", "Unforeseen"]
