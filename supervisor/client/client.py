"""`Client`: the daemon's control API as typed, awaitable calls (anyio; asyncio or trio).

::

    async with connect(root=Path("/var/lib/hunter")) as client:
        session = await client.open_session("demo")
        handle = await client.submit_instruction(session.session_id, "READ", selector="h1")
        turn = await handle.result()          # follows the turn's events; no polling
        print(turn.state, turn.result)

Everything returned is a frozen value of `supervisor.client.models`; every refusal an
exception of `supervisor.client.errors` named after the protocol's error code.

**Reconnecting.** When the connection drops (the daemon restarted, or was upgraded), a call
that is safe to repeat reconnects (every 0.2 s, for up to ``reconnect_s``) and is sent again:
reads, waits, and submissions that carry an idempotency key (the caller's, or with
``auto_keys=True`` one the client makes up for each), because the daemon answers a repeated one
with the turn it already accepted instead of a second one. Calls that are not safe to repeat (a
submission without a key, opening a session, resolving an escalation, cancelling, draining)
raise `ConnectionLost` and leave the decision to the caller. Keys are not the default because
the daemon serves keyed submissions on a slower path today (it looks each key up first: about
half the turns per second, `benchmarks/bench_client.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import anyio
import anyio.abc
import msgspec

from supervisor.client.discovery import locate_daemon
from supervisor.client.errors import SubscriberTooSlow, error_for
from supervisor.client.models import (
    SETTLED_STATES,
    DecisionRecord,
    Executor,
    LedgerCheck,
    Session,
    Turn,
)
from supervisor.control.client import ControlClient, Subscription
from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning
from supervisor.feed import Event

__all__ = ["Client", "TurnHandle", "connect", "find_socket"]

T = TypeVar("T")

#: Operations a dropped connection may send again after reconnecting (they change nothing, or
#: carry an idempotency key: ``turn.submit`` always does from this client).
_REPEATABLE: Final = frozenset(
    {
        "ping",
        "session.list",
        "turn.submit",
        "turn.get",
        "turn.wait",
        "turns.list",
        "status",
        "executors.list",
        "escalations.list",
        "ledger.verify",
    }
)


def find_socket(
    *,
    socket: Path | str | None = None,
    root: Path | str | None = None,
    config: Path | str | None = None,
) -> Path:
    """The daemon's control socket, found as the ``hunter`` commands find it: *socket*, else
    ``<root>/run/control.sock``, else ``$HUNTER_CONTROL_SOCKET``, else what the configuration
    ``hunter serve`` would read says (*config*, else ``$HUNTER_CONFIG``, with the ``HUNTER_*``
    variables; docs/configuration.md, "How client commands find the daemon")."""
    return locate_daemon(socket=socket, root=root, config=config).path


def _as(kind: type[T], value: object) -> T:
    return msgspec.convert(value, kind)


class TurnHandle:
    """A submitted turn: its id, the turn as accepted, and its outcome when it settles."""

    __slots__ = ("_client", "created", "turn", "warnings")

    def __init__(self, client: Client, turn: Turn, created: bool, warnings: Sequence[str]) -> None:
        self._client = client
        #: the turn as the answer to the submission showed it
        self.turn = turn
        #: False: the idempotency key named a turn accepted before (this is that turn)
        self.created = created
        #: what the daemon said the client should know at once (no executor serves it, ...)
        self.warnings = tuple(warnings)

    @property
    def turn_id(self) -> int:
        return self.turn.turn_id

    async def result(self, *, timeout_s: float | None = None) -> Turn:
        """The turn once it settles (final or escalated): at once when the submission's answer
        already showed it settled (``wait_s``); `TimeoutError` when *timeout_s* passes first."""
        if self.turn.settled:
            return self.turn
        return await self._client.wait(self.turn_id, timeout_s=timeout_s)

    async def cancel(self) -> Turn:
        return await self._client.cancel(self.turn_id)

    def __repr__(self) -> str:
        return f"TurnHandle(turn_id={self.turn_id}, state={self.turn.state!r})"


class Client:
    """One connection to a daemon's control API, reconnecting when it drops (see the module
    docstring). Use it as an async context manager, or `connect`."""

    def __init__(self, socket: Path, *, reconnect_s: float = 30.0, auto_keys: bool = True) -> None:
        self.socket = Path(socket)
        self.reconnect_s = reconnect_s
        #: give each submission without an idempotency key one of its own, so that it is safe
        #: to send again after a lost connection (False: such a submission is not sent again)
        self.auto_keys = auto_keys
        self._conn: ControlClient | None = None
        self._release: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._generation = 0

    async def __aenter__(self) -> Client:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            self._conn = await tg.start(self._hold)
        except BaseException as exc:
            await tg.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg, self._tg, self._conn = self._tg, None, None
        if self._release is not None:
            self._release.set()
        if tg is not None:
            await tg.__aexit__(None, None, None)

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[ControlClient]) -> None:
        """Hold one connection open in a task of the client's own (so that a new one can
        replace it from any task) until released."""
        release = anyio.Event()
        async with ControlClient(self.socket) as conn:
            self._release = release
            task_status.started(conn)
            await release.wait()

    async def _reconnect(self, seen: int) -> ControlClient:
        """A fresh connection after *seen* (the generation that failed): one task reconnects,
        the others wait for it; raises the last error after ``reconnect_s``."""
        async with self._lock:
            if self._generation != seen and self._conn is not None:
                return self._conn
            tg = self._tg
            if tg is None:
                raise ConnectionLost(f"the client of {self.socket} is closed")
            if self._release is not None:
                self._release.set()
            self._conn = None
            last: Exception | None = None
            with anyio.move_on_after(self.reconnect_s):
                while True:
                    try:
                        conn: ControlClient = await tg.start(self._hold)
                    except DaemonNotRunning as exc:
                        last = exc
                        await anyio.sleep(0.2)
                        continue
                    self._conn = conn
                    self._generation += 1
                    return conn
            raise last or ConnectionLost(f"no daemon at {self.socket} for {self.reconnect_s} s")

    async def reconnect_if_lost(self) -> None:
        """Open a new connection if this one dropped (waiting up to ``reconnect_s``)."""
        conn = self._conn
        if conn is None or conn.closed:
            await self._reconnect(self._generation)

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        """One request; its result, or the typed exception of its error. Reconnects and sends
        again when the connection drops and *op* is safe to repeat."""
        while True:
            conn, generation = self._conn, self._generation
            if conn is None:
                msg = f"the client of {self.socket} is not open (use `async with`)"
                raise ConnectionLost(msg)
            try:
                return await conn.call(op, **params)
            except ControlClientError as exc:
                raise error_for(exc) from None
            except ConnectionLost:
                unkeyed = op == "turn.submit" and not params.get("idempotency_key")
                if op not in _REPEATABLE or unkeyed or self.reconnect_s <= 0:
                    raise
                await self._reconnect(generation)

    # -- sessions ---------------------------------------------------------------------------

    async def open_session(
        self,
        package_id: str,
        *,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
    ) -> Session:
        optional: dict[str, object] = {
            "work_order_id": work_order_id,
            "workspace": workspace,
            "tenant": tenant,
            "priority": priority,
        }
        params = {k: v for k, v in optional.items() if v is not None}
        answer = await self.call("session.open", package_id=package_id, tier=tier, **params)
        return _as(Session, answer)

    async def close_session(self, session_id: str) -> Session:
        return _as(Session, await self.call("session.close", session_id=session_id))

    async def sessions(self) -> list[Session]:
        return _as(list[Session], (await self.call("session.list"))["sessions"])

    # -- turns ------------------------------------------------------------------------------

    async def submit_instruction(
        self,
        session_id: str,
        command_type: str,
        *,
        selector: str | None = None,
        url: str | None = None,
        parameters: Mapping[str, object] | None = None,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        wait_s: float | None = None,
        compact: bool = False,
    ) -> TurnHandle:
        """Submit an instruction turn for an executor (``READ``, ``CLICK``, ...). *wait_s*:
        answer only once the turn settles (at most that long: one round trip for both);
        *compact*: the answer carries the turn's outcome only (section 5.4)."""
        spec: dict[str, Any] = {"kind": "instruction", "command_type": command_type}
        if selector is not None:
            spec["target_selector"] = selector
        if url is not None:
            spec["target_url"] = url
        if parameters:
            spec["parameters"] = dict(parameters)
        return await self._submit(
            session_id,
            spec,
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
            wait_s=wait_s,
            compact=compact,
        )

    async def submit_process(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        declared_outputs: Iterable[str | Mapping[str, str]] = (),
        declared_inputs: Iterable[str] = (),
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        wait_s: float | None = None,
        compact: bool = False,
    ) -> TurnHandle:
        """Submit a process turn, run in the session's sandbox; *declared_outputs*: the paths
        (or ``{path, role}``) it may write, checked before anything is promoted; *wait_s* and
        *compact* as for `submit_instruction`."""
        outputs = [{"path": o} if isinstance(o, str) else dict(o) for o in declared_outputs]
        spec: dict[str, Any] = {"kind": "process", "argv": list(argv), "declared_outputs": outputs}
        inputs = list(declared_inputs)
        if inputs:
            spec["declared_inputs"] = inputs
        return await self._submit(
            session_id,
            spec,
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
            wait_s=wait_s,
            compact=compact,
        )

    async def _submit(
        self,
        session_id: str,
        spec: dict[str, Any],
        *,
        timeout_ms: int | None,
        idempotency_key: str | None,
        traceparent: str | None,
        wait_s: float | None,
        compact: bool,
    ) -> TurnHandle:
        params: dict[str, Any] = {"session_id": session_id, **spec}
        params.setdefault("declared_outputs", [])
        # A key of its own makes a submission safe to send again after a lost connection.
        key = idempotency_key or (f"hc-{uuid.uuid4().hex}" if self.auto_keys else None)
        if key is not None:
            params["idempotency_key"] = key
        if timeout_ms is not None:
            params["timeout_ms"] = timeout_ms
        if traceparent is not None:
            params["traceparent"] = traceparent
        if wait_s is not None:
            params["wait_s"] = wait_s
        if compact:
            params["answer"] = "compact"
        answer = await self.call("turn.submit", **params)
        return TurnHandle(
            self, _as(Turn, answer["turn"]), bool(answer["created"]), answer.get("warnings", ())
        )

    async def get_turn(self, turn_id: int) -> Turn:
        return _as(Turn, (await self.call("turn.get", turn_id=turn_id))["turn"])

    async def decision_record(self, turn_id: int) -> DecisionRecord:
        """The turn with every attempt, decision and reason, and its ledger entries."""
        answer = await self.call("turn.get", turn_id=turn_id)
        ledger = answer.get("ledger") or {}
        return _as(DecisionRecord, {"turn": answer["turn"], **ledger})

    async def cancel(self, turn_id: int) -> Turn:
        return _as(Turn, (await self.call("turn.cancel", turn_id=turn_id))["turn"])

    async def wait(self, turn_id: int, *, timeout_s: float | None = None) -> Turn:
        """The turn once it settles (final, or escalated for an operator). It follows the
        turn's events (subscribed before the turn is read: nothing falls between); raises
        `TimeoutError` when *timeout_s* passes first."""
        async with self.as_completed([turn_id], timeout_s=timeout_s) as done:
            async for turn in done:
                return turn
        raise AssertionError("unreachable")  # pragma: no cover - the iterator yields or raises

    def as_completed(
        self, turn_ids: Iterable[int], *, timeout_s: float | None = None
    ) -> Completion:
        """Each of *turn_ids* as it settles, in the order they settle, over one subscription::

            async with client.as_completed(ids, timeout_s=60) as done:
                async for turn in done:
                    ...

        `TimeoutError` when *timeout_s* passes before the last one settles."""
        return Completion(self, turn_ids, timeout_s)

    async def turns(
        self, *, session_id: str | None = None, page_size: int = 500
    ) -> AsyncIterator[Turn]:
        """Every turn (of a session), oldest first, a page at a time."""
        after = 0
        while True:
            params: dict[str, Any] = {"after_turn_id": after, "limit": page_size}
            if session_id is not None:
                params["session_id"] = session_id
            page = await self.call("turns.list", **params)
            for turn in _as(list[Turn], page["turns"]):
                yield turn
            if page["next_after"] is None:
                return
            after = int(page["next_after"])

    # -- executors, escalations, ledgers ------------------------------------------------------

    async def executors(self, *, page_size: int = 500) -> AsyncIterator[Executor]:
        """Every executor the daemon knows, by id, a page at a time."""
        after = ""
        while True:
            page = await self.call("executors.list", after_executor_id=after, limit=page_size)
            for executor in _as(list[Executor], page["executors"]):
                yield executor
            if page["next_after"] is None:
                return
            after = str(page["next_after"])

    async def escalations(self) -> list[Turn]:
        """Turns parked for an operator's decision, oldest first."""
        return _as(list[Turn], (await self.call("escalations.list"))["escalations"])

    async def resolve(self, turn_id: int, action: str, **attribution: str) -> Turn:
        """Resolve an escalated turn: *action* ``"retry"`` or ``"terminate"``; *attribution*:
        ``reason`` and ``operator`` where the daemon records them."""
        answer = await self.call(
            "escalations.resolve", turn_id=turn_id, action=action, **attribution
        )
        return _as(Turn, answer["turn"])

    async def verify_ledgers(self, *, session_id: str | None = None) -> LedgerCheck:
        params = {"session_id": session_id} if session_id is not None else {}
        return _as(LedgerCheck, await self.call("ledger.verify", **params))

    async def status(self) -> dict[str, object]:
        """The daemon's status for people and dashboards (docs/control-protocol.md `status`:
        fields may be added, so it stays a mapping)."""
        return dict(await self.call("status"))

    # -- events -------------------------------------------------------------------------------

    @asynccontextmanager
    async def events(
        self,
        *,
        sessions: Iterable[str] | None = None,
        turns: Iterable[int] | None = None,
        kinds: Iterable[str] | None = None,
        after: str | None = None,
    ) -> AsyncIterator[Events]:
        """Follow the daemon's change feed (``events.subscribe``): an async iterator of typed
        `Event`s; ``last`` is the cursor to resume from (``after=``)."""
        conn = self._conn
        if conn is None:
            raise ConnectionLost(f"the client of {self.socket} is not open (use `async with`)")
        params: dict[str, Any] = {}
        if sessions is not None:
            params["sessions"] = sorted(sessions)
        if turns is not None:
            params["turns"] = sorted(turns)
        if kinds is not None:
            params["kinds"] = sorted(kinds)
        if after is not None:
            params["after"] = after
        try:
            async with conn.subscribe(**params) as subscription:
                yield Events(subscription)
        except ControlClientError as exc:
            raise error_for(exc) from None


class Completion:
    """`Client.as_completed`: an async context manager holding the subscription, and an async
    iterator of the turns as they settle. A subscription the daemon cuts off or a connection
    that drops is taken up again, and the turns still awaited are read again: nothing is
    missed."""

    def __init__(self, client: Client, turn_ids: Iterable[int], timeout_s: float | None) -> None:
        self._client = client
        self._waiting = set(turn_ids)
        self._ready: list[Turn] = []
        self._deadline = anyio.current_time() + timeout_s if timeout_s is not None else float("inf")
        self._stack: AsyncExitStack | None = None
        self._events: Events | None = None

    async def __aenter__(self) -> Completion:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        stack, self._stack, self._events = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def _follow(self) -> Events:
        """The subscription, opened (again) if need be; then the awaited turns are read, so
        that one that settled before it is not missed."""
        if self._events is not None:
            return self._events
        stack = AsyncExitStack()
        events = await stack.enter_async_context(self._client.events(turns=self._waiting))
        self._stack, self._events = stack, events
        for turn_id in sorted(self._waiting):
            turn = await self._client.get_turn(turn_id)
            if turn.settled:
                self._waiting.discard(turn_id)
                self._ready.append(turn)
        return events

    def __aiter__(self) -> Completion:
        return self

    async def __anext__(self) -> Turn:
        with anyio.fail_after(max(0.0, self._deadline - anyio.current_time())):
            while not self._ready:
                if not self._waiting:
                    await self._close()
                    raise StopAsyncIteration
                try:
                    events = await self._follow()
                    if self._ready:
                        break
                    event = await events.__anext__()
                except (ConnectionLost, SubscriberTooSlow):
                    await self._close()
                    await self._client.reconnect_if_lost()
                    continue
                if event.turn_id in self._waiting and event.state in SETTLED_STATES:
                    self._waiting.discard(event.turn_id)
                    self._ready.append(await self._client.get_turn(event.turn_id))
            return self._ready.pop(0)


class Events:
    """A subscription's events, typed (`supervisor.feed.Event`)."""

    __slots__ = ("_subscription",)

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    @property
    def gap(self) -> str | None:
        """Why the cursor given could not be honoured (the daemon restarted, or it was too
        old): re-read what you follow. None: nothing was missed."""
        gap = self._subscription.ack.get("gap")
        return str(gap) if gap else None

    @property
    def last(self) -> str:
        """The cursor to resume from without losing or repeating an event."""
        return self._subscription.last

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> Event:
        return _as(Event, await self._subscription.__anext__())


@asynccontextmanager
async def connect(
    *,
    socket: Path | str | None = None,
    root: Path | str | None = None,
    config: Path | str | None = None,
    reconnect_s: float = 30.0,
) -> AsyncIterator[Client]:
    """A `Client` of the daemon found by `find_socket` (open for the block)."""
    async with Client(
        find_socket(socket=socket, root=root, config=config), reconnect_s=reconnect_s
    ) as client:
        yield client
