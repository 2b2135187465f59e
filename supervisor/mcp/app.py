"""The MCP server: `build_server` registers the tools and resources of one `Backend` on the
SDK's `MCPServer`; `serve_stdio` runs it over stdin/stdout (an agent host starts `hunter mcp`
as its subprocess)."""

from __future__ import annotations

from typing import Final

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from supervisor import __version__
from supervisor.mcp.backend import Backend
from supervisor.mcp.config import McpSettings
from supervisor.mcp.resources import LEDGER_URI, TURN_URI, Resources
from supervisor.mcp.tools import Tools

__all__ = ["INSTRUCTIONS", "build_server", "serve_stdio"]

INSTRUCTIONS: Final = """\
HUMANOID HUNTER runs your commands as supervised turns: each in a sandbox confined to an agent
package's capabilities, with a timeout, retries by policy, and two hash-chained ledgers that
prove what ran. Start with list_packages, then open_session; run_command runs a command in the
session (declare every file it writes in declared_outputs: they are then promoted into the
session's workspace, where read_file and list_outputs see them). A turn that escalates waits for
a person (an operator), never for you: wait_turn waits for their decision. verify_ledger checks
the session's ledgers. Close the session when done."""

_READ_ONLY: Final = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_RUNS: Final = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def build_server(backend: Backend) -> MCPServer:
    """An MCP server whose tools and resources act on the daemon through *backend*."""
    server: MCPServer = MCPServer(
        backend.settings.server_name,
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
    )
    tools = Tools(backend)
    server.add_tool(tools.list_packages, annotations=_READ_ONLY)
    server.add_tool(tools.open_session, annotations=_RUNS)
    server.add_tool(tools.close_session, annotations=_RUNS)
    server.add_tool(tools.run_command, annotations=_RUNS)
    server.add_tool(tools.submit_instruction, annotations=_RUNS)
    server.add_tool(tools.wait_turn, annotations=_READ_ONLY)
    server.add_tool(tools.cancel_turn, annotations=_RUNS)
    server.add_tool(tools.decision_record, annotations=_READ_ONLY)
    server.add_tool(tools.verify_ledger, annotations=_READ_ONLY)
    server.add_tool(tools.read_file, annotations=_READ_ONLY)
    server.add_tool(tools.list_outputs, annotations=_READ_ONLY)
    resources = Resources(backend)
    server.resource(LEDGER_URI, mime_type="application/jsonl")(resources.ledger)
    server.resource(TURN_URI, mime_type="application/json")(resources.decision)
    return server


async def serve_stdio(settings: McpSettings) -> None:
    """Serve one MCP client on stdin/stdout until it closes them."""
    async with Backend.open(settings) as backend:
        await build_server(backend).run_stdio_async()
