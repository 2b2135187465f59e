"""The errors a tool answers with: each a `ToolError` (the MCP client gets ``isError`` and the
message, never a traceback), saying what to change."""

from __future__ import annotations

from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["BadInput", "DaemonRefused", "LimitReached", "OutsideWorkspace"]


class BadInput(ToolError):
    """Raised when a tool's arguments are wrong in a way its schema cannot say (an unknown or
    foreign session, a package not allowed, an argv over the bounds); nothing was run."""


class OutsideWorkspace(BadInput):
    """Raised when a path names something outside the session's workspace (``..``, an absolute
    path, a link that leads out) or something that is not a regular file or directory."""


class LimitReached(ToolError):
    """Raised when an MCP session's limit (turns in flight) is reached; nothing was run."""


class DaemonRefused(ToolError):
    """Raised when the daemon refused the request (its error code and message are said)."""
