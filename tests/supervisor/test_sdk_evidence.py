"""What ``Result.success(evidence)`` sends (issue 21): the hash only, unless
``attach_evidence=True``, as supervisor/sdk/executor.py and docs/protocol.md say.

A real in-process daemon, a real SDK executor on its ``executors.sock``, READ turns submitted
over ``control.sock``: a turn whose handler returns ``Result.success(page)`` records
``sha256(page)`` and the daemon keeps no bytes; with ``attach_evidence=True`` it keeps them
under the session, content-addressed, and the turn's result names them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.control.client import ControlClient
from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import WAIT_S, demo_root, serving

HASHED = b"<html><h1 id='hashed'>the hash only</h1></html>"
KEPT = b"<html><h1 id='kept'>hash and bytes</h1></html>"


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package installed; removed afterwards."""
    yield from demo_root("hh-sdkev-")


class PageReader(Executor):
    """READ ``#hashed``: ``Result.success(HASHED)``, the default; READ ``#kept``: the same with
    ``attach_evidence=True``."""

    def __init__(self) -> None:
        super().__init__(executor_id="page-reader")

    async def read(self, instruction: Instruction) -> Result:
        if instruction.target_selector == "#kept":
            return Result.success(KEPT, output={"text": "kept"}, attach_evidence=True)
        return Result.success(HASHED, output={"text": "hashed"})


async def read_turn(client: ControlClient, sid: str, selector: str) -> dict[str, Any]:
    """Run one READ turn of *selector* to its end; the turn."""
    submitted = await client.call(
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type="READ",
        target_selector=selector,
        declared_outputs=[],
    )
    waited = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=WAIT_S)
    return dict(waited["turn"])


def session_dir(root: Path, sid: str) -> Path:
    (found,) = root.glob(f"planes/*/sessions/{sid}")
    return found


def test_success_keeps_the_bytes_only_when_asked() -> None:
    """`Result.success` hashes its evidence; the bytes ride along only with attach_evidence."""
    assert Result.success(HASHED).evidence is None
    assert Result.success(HASHED).evidence_hash == hashlib.sha256(HASHED).hexdigest()
    assert Result.success(KEPT, attach_evidence=True).evidence == KEPT
    assert Result.success("text", attach_evidence=True).evidence == b"text"


async def test_daemon_keeps_evidence_bytes_only_when_attached(root: Path) -> None:
    """Default: the turn records the hash, no evidence reference, no stored file. With
    attach_evidence=True: the turn's result references ``evidence/<sha256>`` under the session
    and the file holds the bytes."""
    async with serving(root, PageReader()) as (client, sid):
        hashed = await read_turn(client, sid, "#hashed")
        kept = await read_turn(client, sid, "#kept")
    session = session_dir(root, sid)
    assert hashed["state"] == "succeeded", hashed
    hashed_digest = hashlib.sha256(HASHED).hexdigest()
    assert hashed["result"]["evidence_hash"] == hashed_digest
    assert "evidence" not in hashed["result"]
    assert not (session / "evidence" / hashed_digest).exists()
    assert kept["state"] == "succeeded", kept
    kept_digest = hashlib.sha256(KEPT).hexdigest()
    assert kept["result"]["evidence_hash"] == kept_digest
    ref = {"sha256": kept_digest, "size": len(KEPT), "path": f"evidence/{kept_digest}"}
    assert kept["result"]["evidence"] == ref
    assert (session / "evidence" / kept_digest).read_bytes() == KEPT
