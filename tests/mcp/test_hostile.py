"""Hostile input: paths out of the workspace (``..``, absolute, links), oversized arguments,
unknown tools, malformed JSON-RPC and a client that never reads. Each gets an error saying what
to change, nothing runs that should not, and the server and the daemon stay up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson

from supervisor.client import Client as HunterClient
from tests.mcp.live import WAIT_S, hunter_mcp, live_daemon, stdio_client


def _data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


def _error(result: Any) -> str:
    assert result.is_error, result.structured_content
    text: str = result.content[0].text
    assert "Traceback" not in text
    return text


async def _turns(socket: Path, session_id: str) -> int:
    async with HunterClient(socket) as hunter:
        return len([t async for t in hunter.turns(session_id=session_id)])


async def test_paths_out_of_the_workspace_are_refused(root: Path) -> None:
    """'..', absolute paths and links that lead out are refused; a link inside is followed."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        _data(
            await mcp.call_tool(
                "run_command",
                {
                    "session_id": sid,
                    "argv": ["/bin/sh", "-c", "echo inside > a.txt"],
                    "declared_outputs": ["a.txt"],
                },
            )
        )
        workspace = root / "workspace" / sid
        secret = root.parent / "secret.txt"
        secret.write_text("do not read", encoding="utf-8")
        (workspace / "out-link").symlink_to(secret)
        (workspace / "dir-link").symlink_to(root.parent)
        (workspace / "in-link").symlink_to(workspace / "a.txt")
        refused = {
            "../secret.txt": "climbs out",
            "/etc/hostname": "is absolute",
            str(secret): "is absolute",
            "out-link": "leads out",
            "dir-link/secret.txt": "leads out",
            "a.txt/../../secret.txt": "climbs out",
            "missing.txt": "no file",
            "": "1 to",
        }
        for path, says in refused.items():
            text = _error(await mcp.call_tool("read_file", {"session_id": sid, "path": path}))
            assert says in text or "at least 1 character" in text, (path, text)
            assert "do not read" not in text
        inside = _data(await mcp.call_tool("read_file", {"session_id": sid, "path": "in-link"}))
        assert inside["content"]["text"] == "inside\n"
        # a declared output that climbs out or is absolute: refused before anything runs
        for bad in ("../escape.txt", "/tmp/escape.txt"):
            text = _error(
                await mcp.call_tool(
                    "run_command",
                    {"session_id": sid, "argv": ["/bin/true"], "declared_outputs": [bad]},
                )
            )
            assert "relative" in text or "climbs out" in text
        assert await _turns(socket, sid) == 1


async def test_bad_and_oversized_arguments_run_nothing(root: Path) -> None:
    """Schema violations, huge arguments, unknown tools, foreign sessions: errors, no turn."""
    async with live_daemon(root) as socket, stdio_client(socket, "--allow-package", "demo") as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        huge = "x" * 40_000
        cases: list[tuple[str, dict[str, object], str]] = [
            ("run_command", {"session_id": sid, "argv": [huge]}, "argv"),
            ("run_command", {"session_id": sid, "argv": ["/bin/echo"] * 300}, "argv"),
            ("run_command", {"session_id": sid, "argv": []}, "argv"),
            ("run_command", {"session_id": sid, "argv": "/bin/true"}, "argv"),
            (
                "run_command",
                {"session_id": sid, "argv": ["/bin/true"], "timeout_s": -1},
                "timeout_s",
            ),
            ("run_command", {"session_id": "SES-not-mine", "argv": ["/bin/true"]}, "open_session"),
            ("open_session", {"package_id": "other"}, "not one this server opens"),
            ("read_file", {"session_id": sid, "path": "a" * 5000}, "path"),
            ("wait_turn", {"turn_id": 424242}, "not started through this MCP session"),
            ("cancel_turn", {"turn_id": 1}, "not started through this MCP session"),
            ("no_such_tool", {}, "Unknown tool"),
        ]
        for tool, arguments, says in cases:
            text = _error(await mcp.call_tool(tool, arguments))
            assert says in text, (tool, text)
        # a program the package may not execute: the daemon refuses it, says why, runs nothing
        text = _error(await mcp.call_tool("run_command", {"session_id": sid, "argv": ["/opt/x"]}))
        assert "capability" in text
        assert await _turns(socket, sid) == 0
        # the server still serves
        assert _data(await mcp.call_tool("list_outputs", {"session_id": sid}))["files"] == []


async def _exchange(
    process: anyio.abc.Process, lines: list[bytes], until_id: int
) -> list[dict[str, Any]]:
    """Send *lines* to a raw `hunter mcp` and read what it answers until the answer to the
    request *until_id*."""
    assert process.stdin is not None
    assert process.stdout is not None
    for line in lines:
        await process.stdin.send(line + b"\n")
    answers: list[dict[str, Any]] = []
    buffer = b""
    with anyio.fail_after(WAIT_S):
        while not any(a.get("id") == until_id for a in answers):
            buffer += await process.stdout.receive()
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                if raw.strip():
                    answers.append(orjson.loads(raw))
    return answers


_INIT = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
)
_INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'


async def test_malformed_json_rpc_is_answered_and_the_server_stays_up(root: Path) -> None:
    """Garbage, a request without a method, an unknown method: errors; then it still serves."""
    params = hunter_mcp(root / "run" / "control.sock")
    async with live_daemon(root) as socket:
        async with await anyio.open_process(
            [params.command, *params.args], env=params.env, cwd=params.cwd
        ) as process:
            answers = await _exchange(process, [_INIT, _INITIALIZED], 1)
            assert answers[0]["result"]["serverInfo"]["name"] == "hunter-mcp"
            answers = await _exchange(
                process,
                [
                    b"{this is not json",
                    b'{"jsonrpc":"2.0","id":2}',
                    b'{"jsonrpc":"2.0","id":3,"method":"no/such/method"}',
                    b'{"jsonrpc":"2.0","id":4,"method":"tools/list"}',
                ],
                4,
            )
            by_id = {a.get("id"): a for a in answers}
            assert "error" in by_id[3]
            assert {t["name"] for t in by_id[4]["result"]["tools"]} >= {"run_command"}
            process.terminate()
        async with HunterClient(socket) as hunter:
            assert (await hunter.call("ping"))["pong"] is True


async def test_a_client_that_never_reads(root: Path) -> None:
    """A client floods requests and never reads: the daemon stays up, another client is served,
    and nothing it asked to run ran more than it asked."""
    params = hunter_mcp(root / "run" / "control.sock")
    async with live_daemon(root) as socket:
        async with await anyio.open_process(
            [params.command, *params.args], env=params.env, cwd=params.cwd
        ) as process:
            await _exchange(process, [_INIT, _INITIALIZED], 1)
            assert process.stdin is not None
            request = (
                b'{"jsonrpc":"2.0","id":%d,"method":"tools/call",'
                b'"params":{"name":"list_packages","arguments":{}}}\n'
            )
            with anyio.move_on_after(5):
                for n in range(10, 5_000):
                    await process.stdin.send(request % n)
            # it never reads: meanwhile the daemon and a well-behaved client are served
            async with stdio_client(socket) as other:
                sid = _data(await other.call_tool("open_session", {"package_id": "demo"}))[
                    "session_id"
                ]
                ran = _data(
                    await other.call_tool("run_command", {"session_id": sid, "argv": ["/bin/true"]})
                )
                assert ran["state"] == "succeeded"
            process.kill()
        async with HunterClient(socket) as hunter:
            assert (await hunter.call("ping"))["pong"] is True
            sessions = await hunter.sessions()
            assert len(sessions) == 2  # the fixture's and the other client's: the flood opened none
