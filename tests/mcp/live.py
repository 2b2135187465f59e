"""A real daemon and a real `hunter mcp` for the MCP tests: the daemon in-process on a fresh
demo root (`tests.live_daemon`) with an executor that answers READ, and the MCP server as the
subprocess an agent host would start (stdio), or serving streamable HTTP with a token."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation

from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import serving

__all__ = ["CLIENT_NAME", "Reader", "http_client", "hunter_mcp", "live_daemon", "stdio_client"]

CLIENT_NAME: Final = "test-agent-host"
CLIENT_VERSION: Final = "3.1.4"
REPO: Final = Path(__file__).resolve().parents[2]
#: every wait of these tests is bounded by this; a healthy run takes far less
WAIT_S: Final = 30.0


class Reader(Executor):
    """Answers READ with the selector it was asked for."""

    def __init__(self) -> None:
        super().__init__(executor_id="mcp-reader")

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page", output={"text": f"read {instruction.target_selector}"})


@asynccontextmanager
async def live_daemon(root: Path) -> AsyncIterator[Path]:
    """A daemon serving *root* with `Reader` connected: its control socket."""
    async with serving(root, Reader()) as _:
        yield root / "run" / "control.sock"


def hunter_mcp(socket: Path, *extra: str) -> StdioServerParameters:
    """How an agent host starts `hunter mcp` (the module form of the `hunter` command)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")}
    env["PYTHONPATH"] = str(REPO)
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "supervisor", "mcp", "--socket", str(socket), "--log-format", "json", *extra],
        env=env,
        cwd=str(REPO),
    )


def stdio_client(socket: Path, *extra: str) -> Client:
    return Client(
        hunter_mcp(socket, *extra),
        client_info=Implementation(name=CLIENT_NAME, version=CLIENT_VERSION),
        read_timeout_seconds=WAIT_S * 2,
    )


def new_token() -> str:
    return secrets.token_hex(32)


@asynccontextmanager
async def http_client(url: str, token: str) -> AsyncIterator[Client]:
    import httpx2

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=WAIT_S * 2) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(
            transport,
            client_info=Implementation(name=CLIENT_NAME, version=CLIENT_VERSION),
            read_timeout_seconds=WAIT_S * 2,
        ) as client:
            yield client
