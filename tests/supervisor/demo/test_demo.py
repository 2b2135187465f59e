"""`hunter demo` as a user runs it: a real subprocess, exit 0 only when every outcome matches."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory others can traverse (the demo's process turns run under their own uid)."""
    path = Path(tempfile.mkdtemp(prefix="hh-demo-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_demo_runs_green(base: Path) -> None:
    """The demo finishes with exit 0, every expected outcome and every ledger verified."""
    root = base / "demo"
    with anyio.fail_after(90):
        proc = await anyio.run_process(
            [sys.executable, "-m", "supervisor", "demo", "--root", str(root), "--fresh"],
            check=False,
        )
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    assert "outcomes as expected, every ledger verified" in out
    expected = (
        "RETRY_AFTER_CRASH",
        "TIMEOUT_RETRY_LIMIT_REACHED",
        "EXECUTOR_REFUSED",
        "SECURITY_VIOLATION_TERMINATE",
        "RESOURCE_EXHAUSTED_ESCALATE",
        "PARTIAL_NOT_RETRYABLE",
        "INVALID_RESPONSE_NOT_RETRYABLE",
        "ledger ok",
    )
    assert [text for text in expected if text not in out] == []
    assert "daemon drained and stopped (exit 0)" in out
