"""The scripted agent of examples/mcp_agent.py, end to end: it creates a program with a bug,
sees its test fail, fixes it, sees the test pass, and verifies the session's ledgers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.mcp.live import REPO, live_daemon, stdio_client


def _example() -> ModuleType:
    path = REPO / "examples" / "mcp_agent.py"
    spec = importlib.util.spec_from_file_location("mcp_agent_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_scripted_agent_creates_tests_and_fixes_a_program(root: Path) -> None:
    """The fixed sequence of tool calls ends as expected, step by step."""
    example = _example()
    said: list[str] = []
    async with live_daemon(root) as socket, stdio_client(socket) as mcp:
        states = await example.run_agent(mcp, say=said.append)
    assert states == example.EXPECTED
    assert any("AssertionError: add(2, 3) is -1" in line for line in said)
    assert any(line.endswith("stdout: ok") for line in said)
    assert any("calc.py" in line and "test_calc.py" in line for line in said)
