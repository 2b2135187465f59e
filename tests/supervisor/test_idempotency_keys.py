"""Idempotency keys as a client meets them (issue 21): a real daemon, its real store (SQLite,
and PostgreSQL on the private test cluster), `turn.submit` over the real control socket.

* The same payload twice under one key: the first turn comes back (``created`` false), and the
  store holds one turn. A new trace context or another ``wait_s`` is still the same payload.
* Another payload under a key already used: ``idempotency_conflict``, naming the key, the
  first turn and the fields that differ, and nothing new is stored.
* Two submissions with one key at once (one connection, answered concurrently): one is
  accepted, the other is decided as above, whether it found the first turn by the look-up or
  by the store's unique key when both accepts raced.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.config import load_config
from supervisor.control.client import ControlClient, ControlClientError
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon
from supervisor.store.postgres import migrate_database
from supervisor.turns.requests import spec_differences
from supervisor.wire.turn_spec import InstructionSpec, ProcessSpec

_TRACE_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_TRACE_B = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed."""
    base = Path(tempfile.mkdtemp(prefix="hh-idem-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest) -> dict[str, object]:
    """The configuration overrides of one store engine (PostgreSQL: a fresh, migrated
    database of this test's own on the session's private cluster)."""
    if request.param == "sqlite":
        return {}
    dsn = str(request.getfixturevalue("pg_dsn"))
    await migrate_database(dsn)
    return {"store.engine": "postgres", "store.dsn": dsn}


@asynccontextmanager
async def daemon_client(root: Path, store: dict[str, object]) -> AsyncIterator[ControlClient]:
    """An in-process daemon on *root* (its logs go to memory), and a client of its socket."""
    configure_logging(fmt="json", stream=io.StringIO())
    config = load_config(None, env={}, overrides={"root": root, **store})
    daemon = Daemon(config, handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                async with ControlClient(config.control_socket) as client:
                    yield client
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


async def _session(client: ControlClient) -> str:
    return str((await client.call("session.open", package_id="demo"))["session_id"])


async def _stored(client: ControlClient, sid: str) -> list[dict[str, Any]]:
    return list((await client.call("turns.list", session_id=sid))["turns"])


def _read(sid: str, key: str, **changes: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "session_id": sid,
        "kind": "instruction",
        "command_type": "READ",
        "target_selector": "h1",
        "parameters": {"url": "https://a.example/"},
        "declared_outputs": [],
        "idempotency_key": key,
    }
    params.update(changes)
    return params


async def test_same_payload_twice_answers_the_first_turn(
    root: Path, store: dict[str, object]
) -> None:
    """A client that resubmits (a lost answer, a restart) gets its first turn back; a new
    `traceparent` or another `wait_s` is still the same payload. One turn is stored."""
    async with daemon_client(root, store) as client:
        sid = await _session(client)
        first = await client.call("turn.submit", **_read(sid, "order-41", traceparent=_TRACE_A))
        again = await client.call("turn.submit", **_read(sid, "order-41"))
        retried = await client.call(
            "turn.submit", **_read(sid, "order-41", traceparent=_TRACE_B, wait_s=0)
        )
        assert (first["created"], again["created"], retried["created"]) == (True, False, False)
        turn_id = first["turn"]["turn_id"]
        assert again["turn"]["turn_id"] == retried["turn"]["turn_id"] == turn_id
        assert [t["turn_id"] for t in await _stored(client, sid)] == [turn_id]


async def test_other_payload_under_a_used_key_is_refused(
    root: Path, store: dict[str, object]
) -> None:
    """Another payload under a key already used is refused with `idempotency_conflict`: the
    message names the key, the first turn and each differing field (an instruction parameter
    as `parameters.<name>`) and says what to do; nothing new is stored and the first turn is
    unchanged."""
    async with daemon_client(root, store) as client:
        sid = await _session(client)
        first = (await client.call("turn.submit", **_read(sid, "order-41")))["turn"]
        other = _read(
            sid,
            "order-41",
            command_type="CLICK",
            parameters={"url": "https://b.example/"},
            timeout_ms=5000,
        )
        with pytest.raises(ControlClientError) as refused:
            await client.call("turn.submit", **other)
        error = refused.value
        turn_id = first["turn_id"]
        assert error.code == "idempotency_conflict"
        assert error.message == (
            f"idempotency key 'order-41' already names turn {turn_id} of session {sid}, and"
            " this request differs from it in timeout_ms, command_type, parameters.url: use a"
            f" new key to submit another turn, or resubmit the same payload to get turn"
            f" {turn_id} back"
        )
        assert error.details == {
            "idempotency_key": "order-41",
            "turn_id": turn_id,
            "session_id": sid,
            "fields": ["timeout_ms", "command_type", "parameters.url"],
        }
        # another kind of turn under the key: `kind` (and what every kind has) is named
        with pytest.raises(ControlClientError) as process:
            await client.call(
                "turn.submit",
                session_id=sid,
                kind="process",
                argv=["true"],
                declared_outputs=[],
                idempotency_key="order-41",
            )
        assert process.value.code == "idempotency_conflict"
        assert process.value.details["fields"] == ["kind"]
        stored = await _stored(client, sid)
        assert [t["turn_id"] for t in stored] == [turn_id]
        assert stored[0]["spec"] == first["spec"]
        # the same payload still gets the first turn back, and a new key a new turn
        again = await client.call("turn.submit", **_read(sid, "order-41"))
        assert (again["created"], again["turn"]["turn_id"]) == (False, turn_id)
        new = await client.call("turn.submit", **{**other, "idempotency_key": "order-42"})
        assert new["created"] is True
        assert len(await _stored(client, sid)) == 2


async def test_two_submits_with_one_key_at_once(root: Path, store: dict[str, object]) -> None:
    """For each of 40 keys, two submissions that differ in `target_selector` are sent together
    (each answered by its own task): exactly one is accepted, the other is refused naming
    `target_selector` and the accepted turn, and the store holds one turn per key. (When both
    missed the look-up, the loser found the first turn at the store's unique key.)"""
    keys = [f"k{n}" for n in range(40)]
    answers: dict[str, list[dict[str, Any] | ControlClientError]] = {k: [] for k in keys}
    async with daemon_client(root, store) as client:
        sid = await _session(client)

        async def submit(key: str, selector: str) -> None:
            try:
                answer = await client.call(
                    "turn.submit", **_read(sid, key, target_selector=selector)
                )
            except ControlClientError as exc:
                answers[key].append(exc)
            else:
                answers[key].append(answer)

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(submit, key, "#a")
                tg.start_soon(submit, key, "#b")
        stored = await _stored(client, sid)
    assert sorted(t["idempotency_key"] for t in stored) == sorted(keys)
    by_key = {t["idempotency_key"]: t["turn_id"] for t in stored}
    for key in keys:
        accepted = [a for a in answers[key] if isinstance(a, dict)]
        refused = [a for a in answers[key] if isinstance(a, ControlClientError)]
        assert len(accepted) == len(refused) == 1, (key, answers[key])
        assert accepted[0]["created"] is True
        assert accepted[0]["turn"]["turn_id"] == by_key[key]
        assert refused[0].code == "idempotency_conflict"
        assert refused[0].details["fields"] == ["target_selector"]
        assert refused[0].details["turn_id"] == by_key[key]


def test_differences_are_named_in_the_spec_order() -> None:
    """`spec_differences`, what the error's `fields` lists: none for the same spec or one that
    differs only in its trace context; else the top-level fields, parameters by name; of two
    kinds, `kind`."""
    read = InstructionSpec(
        timeout_ms=30_000,
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"url": "a", "depth": 1},
    )
    assert spec_differences(read, read) == []
    traced = InstructionSpec(
        timeout_ms=30_000,
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"url": "a", "depth": 1},
        traceparent=_TRACE_A,
    )
    assert spec_differences(read, traced) == []
    other = InstructionSpec(
        timeout_ms=30_000,
        declared_inputs=("in.txt",),
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"url": "b", "extra": True},
    )
    assert spec_differences(read, other) == [
        "declared_inputs",
        "parameters.url",
        "parameters.depth",
        "parameters.extra",
    ]
    # compared as JSON: the order of the parameters does not count, 1 is not true
    reordered = InstructionSpec(
        timeout_ms=30_000,
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"depth": 1, "url": "a"},
    )
    assert spec_differences(read, reordered) == []
    flagged = InstructionSpec(
        timeout_ms=30_000,
        command_type=ExecutorCommandType.READ,
        target_selector="h1",
        parameters={"url": "a", "depth": True},
    )
    assert spec_differences(read, flagged) == ["parameters.depth"]
    process = ProcessSpec(timeout_ms=30_000, argv=("true",))
    assert spec_differences(process, ProcessSpec(timeout_ms=30_000, argv=("false",))) == ["argv"]
    assert spec_differences(read, process) == ["kind"]
