"""The logger seam of the executor hub: what it calls on the logger it is given.

A structlog ``FilteringBoundLogger`` (``supervisor.logging.get_logger``) fits, and so does a
test double that records events. Event names and fields are part of the operator interface.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["EventLog"]


class EventLog(Protocol):
    """A structlog-shaped logger: one method per level, an event name and keyword fields."""

    def debug(self, event: str, **kw: object) -> object: ...
    def info(self, event: str, **kw: object) -> object: ...
    def warning(self, event: str, **kw: object) -> object: ...
    def exception(self, event: str, **kw: object) -> object: ...
