"""The TypeScript reference executor (examples/ts-executor, issue 21 section 4) against a real
daemon: it is written from docs/protocol.md alone, so these tests check that the document is
enough to write an executor in another language.

The example is built once (``npm ci`` and ``tsc`` in a copy of it), then started with
``node`` as a separate process on the in-process daemon's ``executors.sock``. It prints one
JSON line per event (welcome, instruction, cancel, response, disconnected, ...) on stdout,
which the tests follow. Checked: hello (the executor is listed with its commands), heartbeats
(it stays READY over many heartbeat windows with no other frame), a READ turn whose evidence
bytes the daemon stores, a turn cancelled by its client and one cancelled by its deadline
(the executor sees each cancel and answers it, so its slot comes back), and reconnecting to a
restarted daemon on the same root."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.config import load_config
from supervisor.control.client import ControlClient
from supervisor.server import Daemon
from tests.live_daemon import WAIT_S, demo_root

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ts-executor"
#: Short heartbeats: the daemon drops an executor silent for HEARTBEAT_S x MISSES.
HEARTBEAT_S = 0.2
MISSES = 2
EXECUTOR_ID = "ts-reader-1"


@pytest.fixture(scope="module")
def executor_js(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example built in a copy of its folder (``npm ci``, then ``npm run build``: tsc)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "node and npm are needed to build and run examples/ts-executor "
            "(scripts/setup-system installs them: apt-get install nodejs npm)"
        )
    build = tmp_path_factory.mktemp("ts-executor")
    for name in ("package.json", "package-lock.json", "tsconfig.json"):
        shutil.copy2(EXAMPLE / name, build / name)
    shutil.copytree(EXAMPLE / "src", build / "src")
    for argv in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "build"]):
        done = subprocess.run(
            argv, check=False, cwd=build, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{argv[1:]} failed:\n{done.stdout}\n{done.stderr}"
    built = build / "dist" / "executor.js"
    assert built.is_file()
    return built


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package installed; removed afterwards."""
    yield from demo_root("hh-ts-")


@asynccontextmanager
async def daemon_at(root: Path) -> AsyncIterator[ControlClient]:
    """An in-process daemon on *root* with short heartbeats, and a client of its socket."""
    overrides = {
        "root": root,
        "executors.heartbeat_interval_s": HEARTBEAT_S,
        "executors.heartbeat_misses": MISSES,
    }
    config = load_config(None, env={}, overrides=overrides)
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            async with ControlClient(config.control_socket) as client:
                yield client
        finally:
            daemon.request_drain()


@dataclass
class TsExecutor:
    """The running example: its process and the events it printed so far."""

    process: anyio.abc.Process
    events: list[dict[str, Any]] = field(default_factory=list)
    #: Set (and replaced) at each new event and when stdout closes.
    changed: anyio.Event = field(default_factory=anyio.Event)

    def _wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def pump(self) -> None:
        """Collect the JSON lines the executor prints, until its stdout closes."""
        assert self.process.stdout is not None
        lines = BufferedByteReceiveStream(self.process.stdout)
        while True:
            try:
                line = await lines.receive_until(b"\n", 1 << 20)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                self._wake()
                return
            self.events.append(json.loads(line))
            self._wake()

    def seen(self, event: str, **fields: object) -> list[dict[str, Any]]:
        """The events named *event* whose fields include *fields*."""
        return [
            e
            for e in self.events
            if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(self, event: str, count: int = 1, **fields: object) -> dict[str, Any]:
        """The *count*-th such event, waiting for it (WAIT_S at most)."""
        with anyio.fail_after(WAIT_S):
            while True:
                changed = self.changed
                found = self.seen(event, **fields)
                if len(found) >= count:
                    return found[count - 1]
                await changed.wait()


@asynccontextmanager
async def ts_executor(
    executor_js: Path, socket: Path, *, slots: int = 2
) -> AsyncIterator[TsExecutor]:
    """The example running on *socket* (stopped with SIGTERM after: it exits 0)."""
    argv = ["node", str(executor_js), "--socket", str(socket), "--id", EXECUTOR_ID]
    argv += ["--slots", str(slots), "--max-backoff-ms", "400"]
    process = await anyio.open_process(argv, stdin=subprocess.DEVNULL, stderr=None)
    executor = TsExecutor(process)
    async with anyio.create_task_group() as tg:
        tg.start_soon(executor.pump)
        try:
            yield executor
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.terminate()
                with anyio.fail_after(WAIT_S):
                    await process.wait()
                await process.aclose()
    assert process.returncode == 0, executor.events[-5:]


def stored_evidence(root: Path, sid: str, digest: str) -> bytes:
    """The evidence bytes the daemon stored for session *sid* under *digest*."""
    (session,) = root.glob(f"planes/*/sessions/{sid}")
    return (session / "evidence" / digest).read_bytes()


def executor_socket(root: Path) -> Path:
    return load_config(None, env={}, overrides={"root": root}).executor_socket


async def listed(client: ControlClient) -> dict[str, Any]:
    """The example's row in ``executors.list``."""
    rows = (await client.call("executors.list"))["executors"]
    (row,) = [r for r in rows if r["executor_id"] == EXECUTOR_ID]
    return dict(row)


async def submit_read(
    client: ControlClient, sid: str, *, timeout_ms: int = 10_000, **parameters: object
) -> int:
    submitted = await client.call(
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type="READ",
        target_selector="#title",
        parameters=parameters,
        timeout_ms=timeout_ms,
        declared_outputs=[],
    )
    return int(submitted["turn"]["turn_id"])


async def finished(client: ControlClient, turn_id: int) -> dict[str, Any]:
    waited = await client.call("turn.wait", turn_id=turn_id, timeout_s=WAIT_S)
    turn = dict(waited["turn"])
    assert turn["final"] or turn["state"] == "escalated", turn
    return turn


async def test_hello_heartbeats_and_a_read_with_evidence(executor_js: Path, root: Path) -> None:
    """Hello: listed READY with its commands and slots. Heartbeats: still READY on the same
    connection after many heartbeat windows. READ: the turn succeeds, its result names the
    evidence, and the daemon stored the bytes under the session, content-addressed."""
    async with (
        daemon_at(root) as client,
        ts_executor(executor_js, executor_socket(root)) as executor,
    ):
        await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)
        welcome = await executor.wait_for("welcome", executor_id=EXECUTOR_ID)
        assert welcome["heartbeat_interval_ms"] == int(HEARTBEAT_S * 1000)
        assert welcome["heartbeat_misses"] == MISSES
        row = await listed(client)
        assert row["commands"] == ["READ"]
        assert row["slots"] == 2
        assert row["software"] == "hunter-ts-executor/1.0.0"

        # Nothing but heartbeats for 8 intervals (the daemon drops it after 2 silent ones).
        await anyio.sleep(HEARTBEAT_S * 8)
        after = await listed(client)
        assert after["status"] == "READY", after
        assert after["connected_at_us"] == row["connected_at_us"]
        assert len(executor.seen("welcome")) == 1
        assert executor.seen("disconnected") == []

        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        turn = await finished(client, await submit_read(client, sid, text="Welcome"))
    digest = hashlib.sha256(b"Welcome").hexdigest()
    assert turn["state"] == "succeeded", turn
    result = turn["result"]
    assert result["executor_id"] == EXECUTOR_ID
    assert result["output"] == {"text": "Welcome"}
    assert result["evidence_hash"] == digest
    assert result["evidence"] == {"sha256": digest, "size": 7, "path": f"evidence/{digest}"}
    assert stored_evidence(root, sid, digest) == b"Welcome"
    (response,) = executor.seen("response")
    assert response["evidence_attached"] is True
    # The protocol document's own example: base64 "V2VsY29tZQ==" is "Welcome".
    assert base64.b64decode("V2VsY29tZQ==") == b"Welcome"


async def test_cancels_reach_the_executor_and_it_answers_them(
    executor_js: Path, root: Path
) -> None:
    """A client's turn.cancel while the executor works: the turn ends cancelled and the
    executor gets a cancel (reason "cancelled"). A deadline: a cancel with reason "deadline".
    Each time the executor answers the cancel: its one slot stays taken (BUSY) until it does,
    and an executor that does not answer within cancel_grace_s is marked ERROR."""
    async with (
        daemon_at(root) as client,
        ts_executor(executor_js, executor_socket(root), slots=1) as executor,
    ):
        await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])

        turn_id = await submit_read(client, sid, timeout_ms=60_000, sleep_ms=60_000)
        sent = await executor.wait_for("instruction")
        cancelled = (await client.call("turn.cancel", turn_id=turn_id, reason="test"))["turn"]
        assert cancelled["state"] == "cancelled", cancelled
        assert cancelled["reason_code"] == "CANCELLED_BY_CLIENT"
        iid = sent["instruction_id"]
        cancel = await executor.wait_for("cancel", instruction_id=iid)
        assert cancel == {
            "event": "cancel",
            "instruction_id": iid,
            "reason": "cancelled",
            "known": True,
        }
        answer = await executor.wait_for("response", instruction_id=iid)
        assert answer["response_type"] == "TIMEOUT"
        await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)

        turn = await finished(
            client, await submit_read(client, sid, timeout_ms=300, sleep_ms=60_000)
        )
        assert turn["state"] in {"timeout", "terminated", "escalated"}, turn
        assert turn["fault_type"] == "TIMEOUT", turn
        deadline = executor.seen("cancel", reason="deadline")
        assert deadline, executor.events
        for cancel in deadline:
            await executor.wait_for("response", instruction_id=cancel["instruction_id"])
        await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)
        assert (await listed(client))["status"] == "READY"

        # And it still works.
        again = await finished(client, await submit_read(client, sid, text="still here"))
        assert again["state"] == "succeeded", again


async def test_reconnects_to_a_restarted_daemon(executor_js: Path, root: Path) -> None:
    """The daemon stops (the connection is closed): the executor backs off and retries; a new
    daemon on the same root gets its hello again, and a new turn succeeds on it."""
    socket = executor_socket(root)
    async with ts_executor(executor_js, socket) as executor:
        async with daemon_at(root) as client:
            await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            first = await finished(client, await submit_read(client, sid, text="before"))
            assert first["state"] == "succeeded", first
        await executor.wait_for("disconnected")
        await executor.wait_for("reconnecting")
        await anyio.sleep(HEARTBEAT_S * 3)  # a few failed tries against no daemon
        async with daemon_at(root) as client:
            await client.call("executors.wait", executor_id=EXECUTOR_ID, timeout_s=WAIT_S)
            await executor.wait_for("welcome", count=2)  # its stdout may lag the daemon
            assert len(executor.seen("welcome")) == 2
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            second = await finished(client, await submit_read(client, sid, text="after"))
    assert second["state"] == "succeeded", second
    assert second["result"]["evidence"]["sha256"] == hashlib.sha256(b"after").hexdigest()
