"""A scripted agent (no model): the fixed sequence of MCP tool calls a coding agent makes to
create, test and fix a small program in a hunter session, through `hunter mcp` over stdio.

    .venv/bin/python examples/mcp_agent.py --socket /path/to/control.sock

It writes ``calc.py`` with a bug and a test for it, runs the test (it fails: the turn ends
``failed``, exit code 1, the assertion in stderr), fixes the program, runs the test again (it
passes), reads the fixed file back from the workspace, and verifies the session's ledgers. Every
command is a supervised turn, attributed to this client. Exit code 0 when every step went as
expected. `tests/mcp/test_agent_example.py` runs it end to end.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import Implementation

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
CHECK = "assert add(2, 3) == 5, f'add(2, 3) is {add(2, 3)}'\nprint('ok')\n"
TEST = "from calc import add\n" + CHECK


def _write(path: str, text: str) -> list[str]:
    """A command that writes *text* into *path* (no shell quoting: Python does it)."""
    code = f"open({path!r}, 'w').write({text!r})"
    return ["/usr/bin/python3", "-c", code]


async def _call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        text = result.content[0].text if result.content else "?"  # type: ignore[union-attr]
        raise RuntimeError(f"{tool}: {text}")
    data: dict[str, Any] = result.structured_content or {}
    return data


async def run_agent(client: Client, *, say: Any = print) -> list[str]:
    """The agent's session, step by step; the states of its turns, in order."""
    states: list[str] = []
    session = await _call(client, "open_session", package_id="demo", work_order_id="calc-fix")
    sid = session["session_id"]
    say(f"opened {sid}")

    async def run(argv: list[str], outputs: list[str], why: str) -> dict[str, Any]:
        done = await _call(
            client, "run_command", session_id=sid, argv=argv, declared_outputs=outputs
        )
        states.append(done["state"])
        say(f"{why}: turn {done['turn_id']} {done['state']} (exit {done['exit_code']})")
        return done

    await run(_write("calc.py", BUGGY), ["calc.py"], "write calc.py")
    await run(_write("test_calc.py", TEST), ["test_calc.py"], "write test_calc.py")
    # A turn's working directory is the session's output area, not the workspace: the agent
    # reads the program back from the workspace and runs the test on what it read.
    source = (await _call(client, "read_file", session_id=sid, path="calc.py"))["content"]["text"]
    check = ["/usr/bin/python3", "-c", f"exec({source!r}); exec({CHECK!r})"]
    failing = await run(check, [], "run the test")
    say(f"  stderr: {failing['stderr']['text'].strip().splitlines()[-1]}")
    await run(_write("calc.py", FIXED), ["calc.py"], "fix calc.py")
    fixed = await _call(client, "read_file", session_id=sid, path="calc.py")
    source = fixed["content"]["text"]
    passing = await run(
        ["/usr/bin/python3", "-c", f"exec({source!r}); exec({CHECK!r})"], [], "run the test again"
    )
    say(f"  stdout: {passing['stdout']['text'].strip()}")
    listed = await _call(client, "list_outputs", session_id=sid)
    say("workspace: " + ", ".join(f["path"] for f in listed["files"]))
    verified = await _call(client, "verify_ledger", session_id=sid)
    heads = ", ".join(
        f"{x['ledger_id'].rsplit('/', 1)[1]} #{x['head_seq']}" for x in verified["ledgers"]
    )
    say(f"ledgers verified: {verified['ok']} ({heads})")
    states.append("verified" if verified["ok"] else "ledger-invalid")
    await _call(client, "close_session", session_id=sid)
    return states


EXPECTED = ["succeeded", "succeeded", "failed", "succeeded", "succeeded", "verified"]


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True, help="the daemon's control socket")
    args = parser.parse_args(argv)
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "supervisor", "mcp", "--socket", args.socket]
    )
    info = Implementation(name="scripted-agent", version="1.0")
    async with Client(server, client_info=info) as client:
        states = await run_agent(client)
    return 0 if states == EXPECTED else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
