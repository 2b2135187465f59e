"""Evidence bytes end to end: a real ``hunter serve`` process, a real SDK executor on its
``executors.sock``, instruction turns over ``control.sock``.

An executor's SUCCESS carries its evidence bytes; the daemon checks their sha256 against
``evidence_hash``, stores them content-addressed under the session, and both the turn's result
record and its evidence ledger entry name them. Bytes that are not what the hash says make the
attempt an INVALID_RESPONSE fault."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import verify_root
from sandbox.policy.envelopes import ExecutorResponseType
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.wire.executor import Welcome, decode_executor_message, response_message
from supervisor.wire.frames import encode_frame

pytestmark = pytest.mark.slow

PAGE = b"<html><h1 id='title'>Welcome</h1></html>"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-evd-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    """A running daemon; every ledger verifies afterwards."""
    s = DemoStack(root=root, config_path=prepare_root(root, fresh=True))
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


class Reader(Executor):
    """READ answers SUCCESS with *evidence* as the evidence bytes and *claimed*'s hash."""

    def __init__(self, *, evidence: bytes, claimed: bytes) -> None:
        super().__init__(executor_id="evidence-reader")
        self.evidence = evidence
        self.claimed = claimed
        self.connected = anyio.Event()

    async def on_connected(self, welcome: Welcome) -> None:
        self.connected.set()

    async def read(self, instruction: Instruction) -> Result:
        return Result(
            ExecutorResponseType.SUCCESS,
            evidence_hash=hashlib.sha256(self.claimed).hexdigest(),
            output={"text": "Welcome"},
            evidence=self.evidence,
        )


async def read_turn(stack: DemoStack, executor: Reader) -> tuple[str, dict[str, Any]]:
    """Open a session and run one READ turn on *executor*; the session id and the turn."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_executor(executor, socket_path=stack.executor_socket, reconnect=False)
        )
        await executor.connected.wait()
        async with ControlClient(stack.control_socket) as client:
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            submitted = await client.call(
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector="#title",
                declared_outputs=[],
            )
            waited = await client.call(
                "turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30
            )
        tg.cancel_scope.cancel()
    return sid, dict(waited["turn"])


def session_dir(root: Path, sid: str) -> Path:
    (found,) = root.glob(f"planes/*/sessions/{sid}")
    return found


def turn_evidence_entry(root: Path, sid: str) -> dict[str, Any]:
    lines = (session_dir(root, sid) / "ledger" / "evidence.jsonl").read_text().splitlines()
    (entry,) = [e for e in map(json.loads, lines) if e.get("kind") == "turn"]
    return dict(entry)


async def test_evidence_bytes_are_stored_and_referenced(stack: DemoStack) -> None:
    """The bytes land at ``<session dir>/evidence/<sha256>``; the turn's result and its
    evidence ledger entry both carry that reference."""
    sid, turn = await read_turn(stack, Reader(evidence=PAGE, claimed=PAGE))
    assert turn["state"] == "succeeded", turn
    digest = hashlib.sha256(PAGE).hexdigest()
    ref = {"sha256": digest, "size": len(PAGE), "path": f"evidence/{digest}"}
    assert turn["result"]["evidence"] == ref
    assert turn["result"]["evidence_hash"] == digest
    stored = session_dir(stack.root, sid) / "evidence" / digest
    assert stored.read_bytes() == PAGE
    assert turn_evidence_entry(stack.root, sid)["evidence"] == ref


async def test_evidence_not_matching_its_hash_is_an_invalid_response(stack: DemoStack) -> None:
    """An executor that sends other bytes than its evidence_hash says: every attempt is an
    INVALID_RESPONSE fault (``EVIDENCE_INVALID``), the turn does not succeed, nothing is
    stored."""
    sid, turn = await read_turn(stack, Reader(evidence=b"forged page", claimed=PAGE))
    assert turn["state"] != "succeeded"
    faults = {a["fault_type"] for a in turn["attempts"]}
    assert faults == {"INVALID_RESPONSE"}
    assert "EVIDENCE_INVALID" in turn["attempts"][0]["detail"]
    assert "evidence" not in (turn["result"] or {})
    assert not (session_dir(stack.root, sid) / "evidence").exists()


def test_evidence_travels_as_base64_beside_the_response() -> None:
    """The SDK's ``response`` message carries the bytes as base64 in ``evidence``."""
    result = Result.success(PAGE, attach_evidence=True)
    message = response_message(result.to_wire("i-1"), evidence=result.evidence)
    assert message["evidence"] == base64.b64encode(PAGE).decode()
    decoded = decode_executor_message(json.dumps(message).encode())
    assert decoded.evidence == message["evidence"]  # type: ignore[union-attr]
    assert len(encode_frame(message)) < 2 * len(PAGE) + 512
