"""The SDK's own client against `hunter mcp` over stdio, against a real daemon: a session's
commands run as supervised turns, attributed to the MCP client, in a ledger that verifies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson

from supervisor.cli.turn_record import describe_turn
from supervisor.client import Client as HunterClient
from tests.console.live_console import HOG
from tests.mcp.live import CLIENT_NAME, CLIENT_VERSION, WAIT_S, live_daemon, stdio_client


def _data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


async def test_a_session_end_to_end(root: Path) -> None:
    """List tools, open a session, run a command that writes a declared output, read it back,
    see the turn in the ledger with the MCP client named, verify the ledger."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        assert {"run_command", "read_file", "verify_ledger", "cancel_turn"} <= names
        packages = _data(await mcp.call_tool("list_packages", {}))["packages"]
        assert [p["package_id"] for p in packages] == ["demo"]
        assert packages[0]["capabilities"]["execute"]
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        ran = _data(
            await mcp.call_tool(
                "run_command",
                {
                    "session_id": sid,
                    "argv": ["/bin/sh", "-c", "echo hello > out.txt; echo wrote"],
                    "declared_outputs": ["out.txt"],
                },
            )
        )
        assert ran["state"] == "succeeded"
        assert ran["exit_code"] == 0
        assert ran["stdout"]["text"] == "wrote\n"
        assert [w["path"] for w in ran["realized_writes"]] == ["out.txt"]
        assert [p["path"] for p in ran["promoted_outputs"]] == ["out.txt"]
        assert ran["reason_code"] == "ATTEMPT_SUCCEEDED"
        assert len(ran["ledger"]["evidence_entry_hash"]) == 64
        read = _data(await mcp.call_tool("read_file", {"session_id": sid, "path": "out.txt"}))
        assert read["content"]["text"] == "hello\n"
        listed = _data(await mcp.call_tool("list_outputs", {"session_id": sid}))
        assert [f["path"] for f in listed["files"]] == ["out.txt"]
        record = _data(await mcp.call_tool("decision_record", {"turn_id": ran["turn_id"]}))
        assert record["requested_by"]["client_name"] == CLIENT_NAME
        assert record["evidence_entries"][-1]["requested_by"]["client_version"] == CLIENT_VERSION
        verified = _data(await mcp.call_tool("verify_ledger", {"session_id": sid}))
        assert verified["ok"] is True
        heads = {x["ledger_id"].rsplit("/", 1)[1]: x["head_hash"] for x in verified["ledgers"]}
        assert heads["evidence"] == ran["ledger"]["evidence_entry_hash"]
        # the evidence ledger file itself names the MCP client and the server instance
        ledger = await mcp.read_resource(f"hunter://sessions/{sid}/ledger/evidence")
        lines = [orjson.loads(x) for x in ledger.contents[0].text.splitlines()]  # type: ignore[union-attr]
        asked = [x["requested_by"] for x in lines if "requested_by" in x]
        assert asked[0]["client_name"] == CLIENT_NAME
        assert asked[0]["server_name"] == "hunter-mcp"
        assert asked[0]["via"] == "mcp"
        assert isinstance(asked[0]["pid"], int)
        async with HunterClient(socket) as hunter:
            got = await hunter.call("turn.get", turn_id=ran["turn_id"])
        shown = describe_turn(got["turn"], got["ledger"])
        assert f"{CLIENT_NAME} {CLIENT_VERSION} via mcp (hunter-mcp" in shown
        closed = _data(await mcp.call_tool("close_session", {"session_id": sid}))
        assert closed["state"] == "closed"


async def test_a_forbidden_write_is_a_violation_in_the_answer(root: Path) -> None:
    """A write the package's declaration forbids comes back as a violation: nothing promoted."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        ran = _data(
            await mcp.call_tool(
                "run_command",
                {"session_id": sid, "argv": ["/bin/sh", "-c", "echo x > sneaky.txt"]},
            )
        )
        assert ran["state"] == "violation"
        assert ran["reason_code"] == "SECURITY_VIOLATION_TERMINATE"
        assert ran["violations"][0]["target"] == "sneaky.txt"
        assert ran["promoted_outputs"] == []
        listed = _data(await mcp.call_tool("list_outputs", {"session_id": sid}))
        assert listed["files"] == []


async def test_an_escalated_turn_waits_for_an_operator(root: Path) -> None:
    """A turn that escalates returns waiting; the agent waits; an operator resolves it."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        ran = _data(await mcp.call_tool("run_command", {"session_id": sid, "argv": HOG}))
        assert ran["state"] == "escalated"
        waiting = ran["waiting_for_operator"]
        assert waiting["turn_id"] == ran["turn_id"]
        assert waiting["reason_code"] == ran["reason_code"]
        assert "hunter escalations resolve" in waiting["resolve_with"]
        turn_id = ran["turn_id"]
        # bounded wait while nobody decides: still escalated
        again = _data(await mcp.call_tool("wait_turn", {"turn_id": turn_id, "wait_s": 0.3}))
        assert again["state"] == "escalated"
        decided: dict[str, Any] = {}

        async def agent_waits() -> None:
            decided.update(
                _data(await mcp.call_tool("wait_turn", {"turn_id": turn_id, "wait_s": WAIT_S}))
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(agent_waits)
            async with HunterClient(socket) as hunter:
                await hunter.resolve(turn_id, "terminate", reason="too much memory", operator="op")
        assert decided["state"] == "terminated"
        assert decided["waiting_for_operator"] is None


async def test_cancelling_the_tool_call_cancels_its_turn(root: Path) -> None:
    """The MCP client cancels a call running `sleep`: the daemon's turn is cancelled."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        started = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if message and "started" in message:
                started.set()

        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await mcp.call_tool(
                    "run_command",
                    {"session_id": sid, "argv": ["/bin/sleep", "60"], "timeout_s": 120},
                    progress_callback=on_progress,
                )

            tg.start_soon(call)
            with anyio.fail_after(WAIT_S):
                await started.wait()
            tg.cancel_scope.cancel()
        async with HunterClient(socket) as hunter:
            turns = [t async for t in hunter.turns(session_id=sid)]
            assert len(turns) == 1
            turn = await hunter.wait(turns[0].turn_id, timeout_s=WAIT_S)
        assert turn.state == "cancelled"
        decided = turn.result["decided_by"] if turn.result else None
        assert isinstance(decided, dict)
        assert decided["reason"] == "the MCP client cancelled the tool call"
        assert decided["operator"] == f"mcp:{CLIENT_NAME}"


async def test_progress_arrives_for_a_turn_that_takes_seconds(root: Path) -> None:
    """A two-second turn sends progress: accepted, attempt started, still running, ended."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        lines: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            lines.append(message or "")

        ran = _data(
            await mcp.call_tool(
                "run_command",
                {"session_id": sid, "argv": ["/bin/sleep", "2"]},
                progress_callback=on_progress,
            )
        )
        assert ran["state"] == "succeeded"
        assert lines[0].endswith("accepted (accepted)")
        assert any("attempt 1 started" in x for x in lines)
        assert any("still running after" in x for x in lines)


async def test_instructions_run_on_an_executor(root: Path) -> None:
    """An executor instruction is a turn too: its output, evidence hash and ledger hashes."""
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        sid = _data(await mcp.call_tool("open_session", {"package_id": "demo"}))["session_id"]
        done = _data(
            await mcp.call_tool(
                "submit_instruction",
                {"session_id": sid, "command_type": "READ", "selector": "#title"},
            )
        )
        assert done["state"] == "succeeded"
        assert orjson.loads(done["executor_output"]["text"]) == {"text": "read #title"}
        assert len(done["evidence_hash"]) == 64
        assert done["ledger"]["exec_entry_hash"]
