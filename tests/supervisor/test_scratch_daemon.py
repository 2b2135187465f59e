"""Scratch through the daemon (FR-RT-016): a real ``hunter serve`` process, process turns
submitted on ``control.sock`` with declarations as ``{"path", "role"}`` objects."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import verify_root
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root

pytestmark = pytest.mark.slow

SCRIPT = 'echo r > "$HUNTER_OUTPUT_DIR/report.txt"; echo s > "$TMPDIR/scratch.bin"'


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-scr-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    s = DemoStack(root=root, config_path=prepare_root(root, fresh=True))
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


async def run(client: ControlClient, sid: str, declared: list[object]) -> dict[str, Any]:
    submitted = await client.call(
        "turn.submit",
        session_id=sid,
        kind="process",
        argv=["sh", "-c", SCRIPT],
        declared_outputs=declared,
    )
    waited = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(waited["turn"])


async def test_tmp_writes_need_a_scratch_declaration(stack: DemoStack) -> None:
    """Without ``tmp/**`` scratch the file left in tmp/<sid> is a violation; with it the turn
    succeeds and only the declared output reaches the workspace."""
    async with ControlClient(stack.control_socket) as client:
        opened = await client.call("session.open", package_id="demo")
        sid = str(opened["session_id"])
        blocked = await run(client, sid, ["report.txt"])
        allowed = await run(client, sid, ["report.txt", {"path": "tmp/**", "role": "scratch"}])
    assert blocked["state"] == "violation"
    assert [v["target"] for v in blocked["result"]["violations"]] == ["tmp/scratch.bin"]
    assert allowed["state"] == "succeeded", allowed["result"]
    assert [p["path"] for p in allowed["result"]["promoted_outputs"]] == ["report.txt"]
    assert {(w["area"], w["path"]) for w in allowed["result"]["realized_writes"]} == {
        ("output", "report.txt"),
        ("tmp", "scratch.bin"),
    }
    (workspace,) = stack.root.glob(f"workspace/{sid}")
    assert sorted(p.name for p in workspace.iterdir()) == ["report.txt"]
