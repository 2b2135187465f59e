"""`hunter mcp --http`: the SDK's streamable HTTP client against a real daemon, with the bearer
token; without it, nothing is reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2

from supervisor.client import Client as HunterClient
from supervisor.console.server import parse_listen
from supervisor.mcp import load_settings, serve_http
from tests.mcp.live import CLIENT_NAME, http_client, live_daemon, new_token


def _data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


async def test_streamable_http_with_a_token(root: Path) -> None:
    """Open, run, read back, verify over HTTP; the turn names the MCP client; one event
    subscription serves every call."""
    token = new_token()
    async with live_daemon(root) as socket, anyio.create_task_group() as tg:
        stop = anyio.Event()
        settings = load_settings(socket)
        url = await tg.start(
            lambda task_status: serve_http(
                settings,
                parse_listen("127.0.0.1:0"),
                token,
                handle_signals=False,
                stop=stop,
                task_status=task_status,
            )
        )
        async with httpx2.AsyncClient() as anonymous:
            refused = await anonymous.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "x"})
            assert refused.status_code == 401
            wrong = await anonymous.post(
                url, json={}, headers={"Authorization": "Bearer " + "0" * 64}
            )
            assert wrong.status_code == 401
        async with http_client(url, token) as mcp:
            sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]

            async def run(n: int) -> dict[str, Any]:
                return _data(
                    await mcp.call_tool(
                        "run_command",
                        {
                            "session_id": sid,
                            "argv": ["/bin/sh", "-c", f"echo {n} > out{n}.txt"],
                            "declared_outputs": [f"out{n}.txt"],
                        },
                    )
                )

            results: list[dict[str, Any]] = []

            async def one(n: int) -> None:
                results.append(await run(n))

            async with anyio.create_task_group() as calls:
                for n in range(3):
                    calls.start_soon(one, n)
            assert sorted(r["state"] for r in results) == ["succeeded"] * 3
            read = _data(await mcp.call_tool("read_file", {"session_id": sid, "path": "out2.txt"}))
            assert read["content"]["text"] == "2\n"
            assert _data(await mcp.call_tool("verify_ledger", {"session_id": sid}))["ok"]
            async with HunterClient(socket) as hunter:
                status = await hunter.status()
                record = await hunter.decision_record(results[0]["turn_id"])
            spec = record.turn.spec or {}
            asked = spec["requested_by"]
            assert isinstance(asked, dict)
            assert asked["client_name"] == CLIENT_NAME
            events = status.get("events")
            assert isinstance(events, dict)
            # the daemon's subscribers: this server's one (whatever the calls in flight)
            assert events.get("subscribers") == 1, events
        stop.set()
