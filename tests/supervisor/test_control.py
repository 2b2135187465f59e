"""The control API over a real socket: structured errors, pipelining, bad frames, operations."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from supervisor.client import ControlClient, ControlClientError, DaemonNotRunning, call_once
from supervisor.config import load_config
from supervisor.control import ERROR_CODES
from supervisor.demo import prepare_root
from supervisor.frames import encode_frame
from supervisor.server import Daemon


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse (process turns drop to their own uid), with the demo
    package installed; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="hh-ctl-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def daemon_client(root: Path) -> AsyncIterator[ControlClient]:
    """A client of an in-process daemon serving *root* (drained when the block ends)."""
    config = load_config(None, env={}, overrides={"root": root})
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            async with ControlClient(config.control_socket) as c:
                yield c
        finally:
            daemon.request_drain()


async def _error(client: ControlClient, op: str, **params: object) -> ControlClientError:
    with pytest.raises(ControlClientError) as info:
        await client.call(op, **params)
    assert info.value.code in ERROR_CODES
    return info.value


async def test_unknown_operation_lists_known_ones(root: Path) -> None:
    """An unknown op is refused with unknown_op and the list of operations."""
    async with daemon_client(root) as client:
        err = await _error(client, "turn.explode")
        assert err.code == "unknown_op"
        assert "turn.submit" in str(err.details["operations"])


async def test_unknown_ids_and_packages(root: Path) -> None:
    """Unknown turns, sessions and packages get their own codes and say what to do."""
    async with daemon_client(root) as client:
        assert (await _error(client, "turn.get", turn_id=404)).code == "unknown_turn"
        assert (await _error(client, "turn.get", turn_id="x")).code == "bad_request"
        err = await _error(client, "session.close", session_id="SES-nope")
        assert err.code == "unknown_session"
        assert "hunter session list" in err.message
        err = await _error(client, "session.open", package_id="no-such-package")
        assert err.code == "unknown_package"


async def test_submit_validation_errors(root: Path) -> None:
    """Submissions missing declared_outputs or with a bad instruction are refused."""
    async with daemon_client(root) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        err = await _error(
            client, "turn.submit", session_id=sid, kind="instruction", command_type="READ"
        )
        assert (err.code, err.details["field"]) == ("bad_request", "declared_outputs")
        err = await _error(
            client,
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="NAVIGATE",
            target_url="file:///etc/passwd",
            declared_outputs=[],
        )
        assert (err.code, err.details["field"]) == ("invalid_instruction", "target_url")
        err = await _error(
            client,
            "turn.submit",
            session_id=sid,
            kind="process",
            argv=["/sbin/no-such-tool"],
            declared_outputs=[],
        )
        assert err.code == "capability_violation"


async def test_submit_with_a_bad_wait_accepts_nothing(root: Path) -> None:
    """A submission refused for a bad ``wait_s`` leaves no turn behind."""
    async with daemon_client(root) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        err = await _error(
            client,
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="READ",
            target_selector="#main",
            declared_outputs=[],
            wait_s="soon",
        )
        assert (err.code, err.details["field"]) == ("bad_request", "wait_s")
        assert (await client.call("turns.list", session_id=sid))["turns"] == []


async def test_pipelined_requests_on_one_connection(root: Path) -> None:
    """Many requests in flight on one connection are all answered and matched by id."""
    async with daemon_client(root) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        results: list[str] = []

        async def ask() -> None:
            results.append((await client.call("session.list"))["sessions"][0]["session_id"])

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(ask)
        assert results == [sid] * 50


async def test_process_turn_and_wait_until(root: Path) -> None:
    """A process turn runs; turn.wait returns when the turn is final; status counts it."""
    async with daemon_client(root) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        submitted = await client.call(
            "turn.submit", session_id=sid, kind="process", argv=["true"], declared_outputs=[]
        )
        turn_id = submitted["turn"]["turn_id"]
        turn = (await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"]
        assert turn["state"] == "succeeded"
        assert turn["attempts"][0]["decision"] == "SUCCEED"
        status = await client.call("status")
        assert status["turns_by_state"] == {"succeeded": 1}
        assert status["scheduler"]["sessions_open"] == 1
        verified = await client.call("ledger.verify", session_id=sid)
        assert verified["ok"] is True
        assert [r["entries"] for r in verified["ledgers"]] == [2, 2]
        closed = await client.call("session.close", session_id=sid)
        assert closed["state"] == "closed"
        err = await _error(
            client,
            "turn.submit",
            session_id=sid,
            kind="process",
            argv=["true"],
            declared_outputs=[],
        )
        assert err.code == "session_closed"


async def test_executors_wait_times_out(root: Path) -> None:
    """Waiting for an executor that never comes ends with a timeout error."""
    async with daemon_client(root) as client:
        err = await _error(client, "executors.wait", executor_id="ghost", timeout_s=0.05)
        assert err.code == "timeout"
        assert (await client.call("executors.list")) == {"executors": []}


async def test_oversized_frame_closes_only_that_connection(root: Path) -> None:
    """A frame over the size limit closes its connection; others keep working."""
    async with daemon_client(root) as client:
        socket_path = client.socket_path
        async with await anyio.connect_unix(socket_path) as raw:
            await raw.send(b"\x7f\xff\xff\xff")
            answer = b""
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    answer += await raw.receive()
            assert b"exceeds the 1048576-byte limit" in answer
        assert (await client.call("ping"))["pong"] is True
        assert (await call_once(socket_path, "ping"))["pong"] is True


async def test_no_daemon_is_reported_clearly(tmp_path: Path) -> None:
    """Connecting where no daemon listens names the socket and how to start one."""
    with pytest.raises(DaemonNotRunning, match=r"^no daemon at .*control\.sock \(no such socket"):
        await call_once(tmp_path / "run" / "control.sock", "ping")


async def test_submit_from_a_client_that_vanishes_still_runs(root: Path) -> None:
    """A submit whose client disconnects at once is still accepted, scheduled and run."""
    async with daemon_client(root) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        request = {
            "id": 1,
            "op": "turn.submit",
            "params": {
                "session_id": sid,
                "kind": "process",
                "argv": ["true"],
                "declared_outputs": [],
                "idempotency_key": "vanishing",
                "wait_s": 30,
            },
        }
        async with await anyio.connect_unix(client.socket_path) as raw:
            await raw.send(encode_frame(request))
        again = await client.call(
            "turn.submit",
            session_id=sid,
            kind="process",
            argv=["true"],
            declared_outputs=[],
            idempotency_key="vanishing",
            wait_s=30,
        )
        assert again["turn"]["state"] == "succeeded"
        turns = (await client.call("turns.list", session_id=sid))["turns"]
        assert len(turns) == 1
