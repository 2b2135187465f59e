"""Every Python example of docs/client.md runs, as a user would run it, against a real daemon
(its socket named by ``HUNTER_CONTROL_SOCKET``, the demo package installed, an executor
connected), and prints what it says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import WAIT_S, demo_root, serving

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "client.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


class Fast(Executor):
    def __init__(self) -> None:
        super().__init__(executor_id="docs", slots=16)

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page")


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-cdoc-")


def test_the_page_has_examples() -> None:
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("number", range(len(EXAMPLES)))
async def test_each_example_runs(root: Path, number: int) -> None:
    source = EXAMPLES[number]
    async with serving(root, Fast()):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")}
        env["HUNTER_CONTROL_SOCKET"] = str(root / "run" / "control.sock")
        env["PYTHONPATH"] = str(REPO)
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-c", source],
                capture_output=True,
                text=True,
                timeout=WAIT_S * 3,
                env=env,
                check=False,
            )
        )
    assert done.returncode == 0, f"example {number} failed:\n{source}\n{done.stderr}"
    assert done.stdout.strip(), f"example {number} printed nothing"
    assert "Traceback" not in done.stderr
