"""`hunter mcp`: the daemon as a Model Context Protocol server, so that an agent host's tool
calls become supervised turns (docs/agents.md).

It is a client of the daemon's control socket (`supervisor.client`), as the console is, built on
the official MCP Python SDK (`mcp`). It may import `supervisor.client`, `supervisor.wire` (the
typed `RequestedBy`), `supervisor.control.answers` (a package's manifest as `session.get` shows
it), `supervisor.logging` and `ledger` (where a session's files are); nothing of the daemon's
core. Modules, one noun each: `config` (settings), `attribution` (who asks), `limits` (per MCP
session), `workspace` (bounded reads inside a session's workspace), `progress` (the one event
subscription and the progress it relays), `answers` (the tools' structured results), `backend`
(the daemon link the tools share), `tools`, `resources`, `app` (the MCP server), `http` (the
streamable HTTP form), `cli` (`hunter mcp`).
"""

from supervisor.mcp.app import build_server, serve_stdio
from supervisor.mcp.backend import Backend
from supervisor.mcp.config import McpSettings, load_settings
from supervisor.mcp.http import serve_http

__all__ = ["Backend", "McpSettings", "build_server", "load_settings", "serve_http", "serve_stdio"]
