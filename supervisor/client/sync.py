"""`SyncClient`: the client library for scripts without an event loop of their own.

::

    from supervisor.client import SyncClient

    with SyncClient(root="/var/lib/hunter") as client:
        session = client.open_session("demo")
        turn = client.run_instruction(session.session_id, "READ", selector="h1")
        print(turn.state)

It runs a `Client` on an event loop in a thread of its own (`anyio.from_thread`) and waits
for each call there; the values and exceptions are the async client's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from supervisor.client.client import Client, connect
from supervisor.client.models import DecidedBy, Executor, LedgerCheck, Session, Turn

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient:
    """The blocking face of `Client`: the same calls, each returning when it is done."""

    def __init__(
        self,
        *,
        socket: Path | str | None = None,
        root: Path | str | None = None,
        config: Path | str | None = None,
        reconnect_s: float = 30.0,
    ) -> None:
        self._where: dict[str, Any] = {"socket": socket, "root": root, "config": config}
        self._reconnect_s = reconnect_s
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None
        self._client: Client | None = None

    def __enter__(self) -> SyncClient:
        self._portal = self._stack.enter_context(start_blocking_portal())
        self._client = self._stack.enter_context(
            self._portal.wrap_async_context_manager(
                connect(**self._where, reconnect_s=self._reconnect_s)
            )
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client = None
        self._portal = None
        self._stack.close()

    def _run(self, call: Callable[[Client], Awaitable[T]]) -> T:
        portal, client = self._portal, self._client
        if portal is None or client is None:
            raise RuntimeError("SyncClient is not open: use it in a `with` block")

        async def run() -> T:
            return await call(client)

        return portal.call(run)

    # -- the calls of `Client` ----------------------------------------------------------------

    def open_session(self, package_id: str, **options: Any) -> Session:
        return self._run(lambda c: c.open_session(package_id, **options))

    def close_session(self, session_id: str) -> Session:
        return self._run(lambda c: c.close_session(session_id))

    def sessions(self) -> list[Session]:
        return self._run(lambda c: c.sessions())

    def submit_instruction(self, session_id: str, command_type: str, **options: Any) -> int:
        """Submit; the turn's id (wait for it with `wait`)."""

        async def submit(c: Client) -> int:
            return (await c.submit_instruction(session_id, command_type, **options)).turn_id

        return self._run(submit)

    def submit_process(self, session_id: str, argv: Sequence[str], **options: Any) -> int:
        async def submit(c: Client) -> int:
            return (await c.submit_process(session_id, argv, **options)).turn_id

        return self._run(submit)

    def run_instruction(
        self, session_id: str, command_type: str, *, timeout_s: float | None = None, **options: Any
    ) -> Turn:
        """Submit an instruction turn and wait until it settles."""

        async def run(c: Client) -> Turn:
            handle = await c.submit_instruction(session_id, command_type, **options)
            return await handle.result(timeout_s=timeout_s)

        return self._run(run)

    def run_process(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        **options: Any,
    ) -> Turn:
        """Submit a process turn and wait until it settles."""

        async def run(c: Client) -> Turn:
            handle = await c.submit_process(session_id, argv, **options)
            return await handle.result(timeout_s=timeout_s)

        return self._run(run)

    def get_turn(self, turn_id: int, *, compact: bool = False) -> Turn:
        return self._run(lambda c: c.get_turn(turn_id, compact=compact))

    def wait(self, turn_id: int, *, timeout_s: float | None = None) -> Turn:
        return self._run(lambda c: c.wait(turn_id, timeout_s=timeout_s))

    def wait_all(self, turn_ids: Iterable[int], *, timeout_s: float | None = None) -> list[Turn]:
        """The turns in the order they settle (`Client.as_completed`)."""
        ids = list(turn_ids)

        async def collect(c: Client) -> list[Turn]:
            async with c.as_completed(ids, timeout_s=timeout_s) as done:
                return [turn async for turn in done]

        return self._run(collect)

    def cancel(
        self, turn_id: int, *, reason: str | None = None, operator: str | None = None
    ) -> Turn:
        return self._run(lambda c: c.cancel(turn_id, reason=reason, operator=operator))

    def turns(
        self,
        *,
        session_id: str | None = None,
        states: Iterable[str] | None = None,
        package_id: str | None = None,
        accepted_since: datetime | None = None,
        accepted_until: datetime | None = None,
    ) -> list[Turn]:
        async def collect(c: Client) -> list[Turn]:
            listed = c.turns(
                session_id=session_id,
                states=states,
                package_id=package_id,
                accepted_since=accepted_since,
                accepted_until=accepted_until,
            )
            return [turn async for turn in listed]

        return self._run(collect)

    def executors(self) -> list[Executor]:
        async def collect(c: Client) -> list[Executor]:
            return [e async for e in c.executors()]

        return self._run(collect)

    def escalations(self) -> list[Turn]:
        return self._run(lambda c: c.escalations())

    def resolve(
        self,
        turn_id: int,
        action: str,
        *,
        reason: str | None = None,
        operator: str | None = None,
    ) -> Turn:
        return self._run(lambda c: c.resolve(turn_id, action, reason=reason, operator=operator))

    def verify_ledgers(self, *, session_id: str | None = None) -> LedgerCheck:
        return self._run(lambda c: c.verify_ledgers(session_id=session_id))

    def status(self) -> Mapping[str, object]:
        return self._run(lambda c: c.status())

    def drain(self, *, reason: str | None = None, operator: str | None = None) -> DecidedBy:
        """Ask the daemon to drain and stop (`Client.drain`)."""
        return self._run(lambda c: c.drain(reason=reason, operator=operator))
