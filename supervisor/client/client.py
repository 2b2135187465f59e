"""`Client`: the daemon's control API as typed, awaitable calls (anyio; asyncio or trio).

::

    async with connect(root=Path("/var/lib/hunter")) as client:
        session = await client.open_session("demo")
        handle = await client.submit_instruction(session.session_id, "READ", selector="h1")
        turn = await handle.result()          # follows the turn's events; no polling
        print(turn.state, turn.result)

Everything returned is a frozen value of `supervisor.client.models`; every refusal an
exception of `supervisor.client.errors` named after the protocol's error code. What follows the
change feed (`Events`, and `Completion` for `as_completed` and `wait`) is in
`supervisor.client.completion`; the connection, its reconnecting and what may be sent again, in
`supervisor.client.connection`.

**Reconnecting.** When the connection drops (the daemon restarted, or was upgraded), a call
that is safe to repeat reconnects (every 0.2 s, for up to ``reconnect_s``) and is sent again:
reads, waits, and submissions that carry an idempotency key (the caller's, or one the client
makes up for each: ``auto_keys``, on by default), because the daemon answers a repeated one with
the turn it already accepted instead of a second one. Calls that are not safe to repeat (a
submission without a key, with ``auto_keys=False``; opening a session, resolving an escalation,
cancelling, draining) raise `ConnectionLost` and leave the decision to the caller. A key costs
the daemon nothing it would notice: it is looked up in the transaction that accepts the turn
(keyed and unkeyed submissions run at the same rate, `benchmarks/bench_client.py`).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import msgspec

from supervisor.client.completion import Completion, Events
from supervisor.client.connection import ClientConnection
from supervisor.client.discovery import locate_daemon
from supervisor.client.errors import error_for
from supervisor.client.models import (
    DecidedBy,
    DecisionRecord,
    EvidenceSlice,
    Executor,
    ExecutorPage,
    LedgerCheck,
    Session,
    SessionInfo,
    Turn,
    TurnPage,
)
from supervisor.errors import ControlClientError
from supervisor.wire.turn_spec import RequestedBy

__all__ = ["Client", "Completion", "Events", "TurnHandle", "connect", "find_socket"]

T = TypeVar("T")


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


def auto_key() -> str:
    """A key the client makes up for a submission (``auto_keys``): ``hc-``, the time in
    nanoseconds (16 hex digits) and 64 random bits. Keys that grow with time fill the end of
    the store's key index (`supervisor.store.sqlite.turns_table`) instead of a page each."""
    return f"hc-{time.time_ns():016x}{secrets.token_hex(8)}"


def _as(kind: type[T], value: object) -> T:
    return msgspec.convert(value, kind)


def _given(**params: Any) -> dict[str, Any]:
    """The params of a request that were given (None: left out, the daemon's default)."""
    return {k: v for k, v in params.items() if v is not None}


def _micros(when: datetime | None) -> int | None:
    """*when* in microseconds since the epoch (None stays None)."""
    return None if when is None else round(when.timestamp() * 1_000_000)


def _attribution(reason: str | None, operator: str | None) -> dict[str, str]:
    """The ``reason`` and ``operator`` params of a decision, those given."""
    return _given(reason=reason, operator=operator)


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

    async def cancel(self, *, reason: str | None = None, operator: str | None = None) -> Turn:
        """Cancel the turn (`Client.cancel`)."""
        return await self._client.cancel(self.turn_id, reason=reason, operator=operator)

    def to_dict(self) -> dict[str, object]:
        """The submission's answer as the daemon sent it: ``turn``, ``created`` and, when
        there are some, ``warnings``."""
        answer: dict[str, object] = {"turn": self.turn.to_dict(), "created": self.created}
        if self.warnings:
            answer["warnings"] = list(self.warnings)
        return answer

    def __repr__(self) -> str:
        return f"TurnHandle(turn_id={self.turn_id}, state={self.turn.state!r})"


class Client:
    """One connection to a daemon's control API, reconnecting when it drops (see the module
    docstring). Use it as an async context manager, or `connect`."""

    def __init__(self, socket: Path, *, reconnect_s: float = 30.0, auto_keys: bool = True) -> None:
        self.socket = Path(socket)
        #: give each submission without an idempotency key one of its own, so that it is safe
        #: to send again after a lost connection (False: such a submission is not sent again)
        self.auto_keys = auto_keys
        self._connection = ClientConnection(self.socket, reconnect_s=reconnect_s)
        #: the typed operations' requests: the connection's, bound once
        self._call = self._connection.call

    @property
    def reconnect_s(self) -> float:
        """How long a dropped connection is tried again (0: never)."""
        return self._connection.reconnect_s

    @reconnect_s.setter
    def reconnect_s(self, value: float) -> None:
        self._connection.reconnect_s = value

    async def __aenter__(self) -> Client:
        await self._connection.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._connection.close()

    async def reconnect_if_lost(self) -> None:
        """Open a new connection if this one dropped (waiting up to ``reconnect_s``)."""
        await self._connection.reconnect_if_lost()

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        """One request; its result, or the typed exception of its error. Reconnects and sends
        again when the connection drops and *op* is safe to repeat (`ClientConnection.call`)."""
        return await self._call(op, **params)

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
        answer = await self._call("session.open", package_id=package_id, tier=tier, **params)
        return _as(Session, answer)

    async def close_session(self, session_id: str) -> Session:
        return _as(Session, await self._call("session.close", session_id=session_id))

    async def sessions(self) -> list[Session]:
        return _as(list[Session], (await self._call("session.list"))["sessions"])

    # -- turns ------------------------------------------------------------------------------

    async def submit_instruction(
        self,
        session_id: str,
        command_type: str,
        *,
        selector: str | None = None,
        url: str | None = None,
        parameters: Mapping[str, object] | None = None,
        declared_inputs: Iterable[str] = (),
        phase: str | None = None,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        wait_s: float | None = None,
        compact: bool = False,
        requested_by: RequestedBy | None = None,
    ) -> TurnHandle:
        """Submit an instruction turn for an executor (``READ``, ``CLICK``, ...). *phase*: the
        agent's phase (``RED``, ``GREEN``, ``VERIFY``, ``REFACTOR``: which outcomes are
        retried); *declared_inputs*: files the turn reads, recorded in its spec; *wait_s*:
        answer only once the turn settles (at most that long: one round trip for both);
        *compact*: the answer carries the turn's outcome only (section 5.4); *requested_by*:
        who asked, for a front end that submits for others (`hunter mcp`), kept with the turn."""
        spec = _given(
            kind="instruction",
            command_type=command_type,
            target_selector=selector,
            target_url=url,
            parameters=dict(parameters) if parameters else None,
            declared_inputs=list(declared_inputs) or None,
            phase=phase,
        )
        options = _given(
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
            wait_s=wait_s,
            answer="compact" if compact else None,
            requested_by=msgspec.to_builtins(requested_by) if requested_by is not None else None,
        )
        return await self._submit(session_id, spec, options)

    async def submit_process(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        declared_outputs: Iterable[str | Mapping[str, str | None]] = (),
        declared_inputs: Iterable[str] = (),
        phase: str | None = None,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        wait_s: float | None = None,
        compact: bool = False,
        requested_by: RequestedBy | None = None,
    ) -> TurnHandle:
        """Submit a process turn, run in the session's sandbox; *declared_outputs*: the paths
        (or ``{path, role}``, role None for none) it may write, checked before anything is
        promoted; *declared_inputs*: the files it reads; *phase*, *wait_s*, *compact* and
        *requested_by* as for `submit_instruction`."""
        outputs = [{"path": o} if isinstance(o, str) else dict(o) for o in declared_outputs]
        spec = _given(
            kind="process",
            argv=list(argv),
            declared_outputs=outputs,
            declared_inputs=list(declared_inputs) or None,
            phase=phase,
        )
        options = _given(
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
            wait_s=wait_s,
            answer="compact" if compact else None,
            requested_by=msgspec.to_builtins(requested_by) if requested_by is not None else None,
        )
        return await self._submit(session_id, spec, options)

    async def _submit(
        self, session_id: str, spec: dict[str, Any], options: dict[str, Any]
    ) -> TurnHandle:
        params: dict[str, Any] = {"session_id": session_id, "declared_outputs": [], **spec}
        # A key of its own makes a submission safe to send again after a lost connection.
        if "idempotency_key" not in options and self.auto_keys:
            params["idempotency_key"] = auto_key()
        answer = await self._call("turn.submit", **params, **options)
        return TurnHandle(
            self, _as(Turn, answer["turn"]), bool(answer["created"]), answer.get("warnings", ())
        )

    async def get_turn(self, turn_id: int, *, compact: bool = False) -> Turn:
        """The turn as it is now. *compact*: only its outcome (section 5.4, `Turn.compact`),
        which the daemon answers without reading the session's ledger files."""
        if compact:
            answer = await self._call("turn.wait", turn_id=turn_id, timeout_s=0, answer="compact")
        else:
            answer = await self._call("turn.get", turn_id=turn_id)
        return _as(Turn, answer["turn"])

    async def decision_record(self, turn_id: int) -> DecisionRecord:
        """The turn with every attempt, decision and reason, and its ledger entries."""
        answer = await self._call("turn.get", turn_id=turn_id)
        ledger = answer.get("ledger") or {}
        return _as(DecisionRecord, {"turn": answer["turn"], **ledger})

    async def cancel(
        self, turn_id: int, *, reason: str | None = None, operator: str | None = None
    ) -> Turn:
        """Cancel the turn (an attempt under way is stopped first): ``cancelled``, with who
        decided (`Turn.decided_by`: *reason* and *operator*, default the user name of the
        caller's uid, and that uid); a turn already final comes back as it is."""
        answer = await self._call("turn.cancel", turn_id=turn_id, **_attribution(reason, operator))
        return _as(Turn, answer["turn"])

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
        self,
        *,
        session_id: str | None = None,
        states: Iterable[str] | None = None,
        package_id: str | None = None,
        accepted_since: datetime | None = None,
        accepted_until: datetime | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[Turn]:
        """Every turn the filters keep (as `turn_page`), oldest first, a page at a time."""
        after: int | None = 0
        while after is not None:
            page = await self.turn_page(
                after=after,
                limit=page_size,
                session_id=session_id,
                states=states,
                package_id=package_id,
                accepted_since=accepted_since,
                accepted_until=accepted_until,
            )
            for turn in page.turns:
                yield turn
            after = page.next_after

    async def turn_page(
        self,
        *,
        after: int = 0,
        limit: int = 500,
        session_id: str | None = None,
        states: Iterable[str] | None = None,
        package_id: str | None = None,
        accepted_since: datetime | None = None,
        accepted_until: datetime | None = None,
    ) -> TurnPage:
        """One page of turns after turn id *after*, oldest first, of those the filters keep
        (each optional; the given ones all hold): of one session, in any of *states*
        (``"running"``, ``"succeeded"``, ...), of the sessions of *package_id*, accepted at
        or after *accepted_since* and before *accepted_until* (a naive time is local)."""
        params = _given(
            after_turn_id=after,
            limit=limit,
            session_id=session_id,
            states=None if states is None else sorted(set(states)),
            package_id=package_id,
            accepted_since_us=_micros(accepted_since),
            accepted_until_us=_micros(accepted_until),
        )
        return _as(TurnPage, await self._call("turns.list", **params))

    async def session(self, session_id: str) -> SessionInfo:
        """A session with its package's capabilities and limits (``session.get``)."""
        return _as(SessionInfo, await self._call("session.get", session_id=session_id))

    async def evidence(
        self, turn_id: int, *, offset: int = 0, length: int | None = None
    ) -> EvidenceSlice:
        """A slice of the evidence bytes a turn's executor sent (`NoEvidence` if it sent only
        their hash); read on from ``offset + len(data)`` while ``more``."""
        answer = await self._call(
            "turn.evidence", **_given(turn_id=turn_id, offset=offset, length=length)
        )
        return _as(EvidenceSlice, {**answer, "data": base64.b64decode(str(answer["data"]))})

    # -- executors, escalations, ledgers ------------------------------------------------------

    async def executors(self, *, page_size: int = 500) -> AsyncIterator[Executor]:
        """Every executor the daemon knows, by id, a page at a time."""
        after: str | None = ""
        while after is not None:
            page = await self.executor_page(after=after, limit=page_size)
            for executor in page.executors:
                yield executor
            after = page.next_after

    async def executor_page(self, *, after: str = "", limit: int = 500) -> ExecutorPage:
        """One page of executors, by id, after *after*."""
        answer = await self._call("executors.list", after_executor_id=after, limit=limit)
        return _as(ExecutorPage, answer)

    async def escalations(self) -> list[Turn]:
        """Every turn parked for an operator's decision, by turn id (read a page at a time)."""
        found: list[Turn] = []
        after: int | None = 0
        while after is not None:
            page = await self.escalation_page(after=after)
            found.extend(page.turns)
            after = page.next_after
        return found

    async def escalation_page(self, *, after: int = 0, limit: int = 500) -> TurnPage:
        """One page of the parked turns, by turn id, after turn id *after*."""
        answer = await self._call("escalations.list", after_turn_id=after, limit=limit)
        return _as(
            TurnPage, {"turns": answer["escalations"], "next_after": answer.get("next_after")}
        )

    async def resolve(
        self,
        turn_id: int,
        action: str,
        *,
        reason: str | None = None,
        operator: str | None = None,
    ) -> Turn:
        """Resolve an escalated turn: *action* ``"retry"`` or ``"terminate"``; *reason*, why
        (the daemon requires it), and *operator* (default: the user name of the caller's uid)
        are recorded with the decision (`Turn.decided_by`)."""
        answer = await self._call(
            "escalations.resolve",
            turn_id=turn_id,
            action=action,
            **_attribution(reason, operator),
        )
        return _as(Turn, answer["turn"])

    async def verify_ledgers(self, *, session_id: str | None = None) -> LedgerCheck:
        params = {"session_id": session_id} if session_id is not None else {}
        return _as(LedgerCheck, await self._call("ledger.verify", **params))

    async def status(self) -> dict[str, object]:
        """The daemon's status for people and dashboards (docs/control-protocol.md `status`:
        fields may be added, so it stays a mapping)."""
        return dict(await self._call("status"))

    async def drain(self, *, reason: str | None = None, operator: str | None = None) -> DecidedBy:
        """Ask the daemon to drain and stop, as on SIGTERM: it accepts no new work
        (`Draining`), lets running attempts finish within ``drain_grace_s``, then stops and
        its socket goes away. A person's decision: recorded with *reason*, *operator* (default:
        the user name of the caller's uid) and the caller's uid, and returned. Not sent again
        after a lost connection."""
        answer = await self._call("drain", **_attribution(reason, operator))
        return _as(DecidedBy, answer["decided_by"])

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
        conn = self._connection.current
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


@asynccontextmanager
async def connect(
    *,
    socket: Path | str | None = None,
    root: Path | str | None = None,
    config: Path | str | None = None,
    reconnect_s: float = 30.0,
    auto_keys: bool = True,
) -> AsyncIterator[Client]:
    """A `Client` of the daemon found by `find_socket` (open for the block); *auto_keys*: give
    each submission without a key one of its own (see `Client`)."""
    async with Client(
        find_socket(socket=socket, root=root, config=config),
        reconnect_s=reconnect_s,
        auto_keys=auto_keys,
    ) as client:
        yield client
