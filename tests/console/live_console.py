"""A real console for tests: an in-process daemon on a fresh root with an executor connected
and a session open (`tests.live_daemon.serving`), and the console serving it on a free loopback
port, its operators file holding a resolver (alice) and a reader (rita)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from supervisor.console.operators import load_operators
from supervisor.console.server import parse_listen, run_console
from supervisor.console.state import ConsoleSettings
from supervisor.control.client import ControlClient
from supervisor.sdk import Executor
from tests.live_daemon import WAIT_S, serving

PASSWORDS = {"alice": "correct horse battery", "rita": "read only please"}
#: the hashes of PASSWORDS (made once by `hash_password`; scrypt costs 50 ms a hash)
OPERATORS_TOML = """
[operators.alice]
role = "resolver"
password = "{alice}"

[operators.rita]
role = "reader"
password = "{rita}"

[operators.proxied]
role = "resolver"
"""


def write_operators(path: Path) -> Path:
    from supervisor.console.operators import hash_password

    path.write_text(
        OPERATORS_TOML.format(**{k: hash_password(v) for k, v in PASSWORDS.items()}),
        encoding="utf-8",
    )
    return path


#: a process turn over the demo package's memory limit: RESOURCE_EXHAUSTED escalates it
HOG = ["python3", "-c", "b = bytearray(512 << 20)"]


@dataclass
class LiveConsole:
    url: str
    client: ControlClient
    session_id: str
    root: Path

    async def read(self, selector: str, *, wait: bool = True) -> dict[str, Any]:
        """Submit a READ of *selector* (and wait until it settles): the turn."""
        answer = await self.client.call(
            "turn.submit",
            session_id=self.session_id,
            kind="instruction",
            command_type="READ",
            target_selector=selector,
            declared_outputs=[],
            **({"wait_s": WAIT_S} if wait else {}),
        )
        turn: dict[str, Any] = answer["turn"]
        return turn

    async def escalate(self) -> int:
        """A turn parked for an operator: its id."""
        answer = await self.client.call(
            "turn.submit",
            session_id=self.session_id,
            kind="process",
            argv=HOG,
            declared_outputs=[],
            wait_s=30,
        )
        assert answer["turn"]["state"] == "escalated", answer["turn"]
        return int(answer["turn"]["turn_id"])


@asynccontextmanager
async def console_for(
    root: Path,
    executor: Executor,
    operators: Path,
    *,
    listen: str = "127.0.0.1:0",
    user_header: str | None = None,
    allowed_hosts: tuple[str, ...] = (),
) -> AsyncIterator[LiveConsole]:
    async with serving(root, executor) as (client, sid):
        settings = ConsoleSettings(
            socket=root / "run" / "control.sock",
            operators=load_operators(operators),
            user_header=user_header,
            allowed_hosts=allowed_hosts,
        )
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            url = await tg.start(
                lambda task_status: run_console(
                    settings,
                    parse_listen(listen),
                    handle_signals=False,
                    stop=stop,
                    task_status=task_status,
                )
            )
            try:
                yield LiveConsole(url, client, sid, root)
            finally:
                stop.set()
