"""docs/control-protocol.md against the code and a real daemon: every operation the server
registers is documented and every documented one exists, the error codes and turn states match,
and the doc's example client works on the real socket."""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from sandbox.policy.lifecycle import FINAL_STATES, TurnState
from supervisor.config import load_config
from supervisor.control.client import ControlClient, ControlClientError
from supervisor.control.server import ERROR_CODES, ControlServer
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon

DOC = Path(__file__).resolve().parents[3] / "docs" / "control-protocol.md"


def _section(text: str, number: int) -> str:
    """The body of `## <number>. ...` up to the next `## ` heading."""
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"{DOC.name} has no section {number}"
    return match.group(0)


def documented_operations(text: str) -> list[str]:
    """The operations of section 6: one `### `op`` heading each."""
    return re.findall(r"^### `([^`]+)`\s*$", _section(text, 6), re.M)


def documented_rows(text: str, number: int) -> dict[str, list[str]]:
    """First-column code -> the other cells, for each table row of section *number*."""
    rows: dict[str, list[str]] = {}
    for line in _section(text, number).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) > 1:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed."""
    base = Path(tempfile.mkdtemp(prefix="hh-doc-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def running(root: Path) -> AsyncIterator[Daemon]:
    """An in-process daemon on *root* (its logs go to memory)."""
    configure_logging(fmt="json", stream=io.StringIO())
    daemon = Daemon(load_config(None, env={}, overrides={"root": root}), handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield daemon
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


async def test_every_registered_operation_is_documented_and_exists(root: Path) -> None:
    """The ops a real ControlServer registers are exactly the documented ones, and each
    documented op is served on the real socket (no `unknown_op`)."""
    documented = documented_operations(DOC.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), "an operation is documented twice"
    async with running(root) as daemon:
        assert daemon.turn_core is not None
        assert daemon.hub is not None
        registered = ControlServer(turn_core=daemon.turn_core, hub=daemon.hub).operations
        missing = sorted(set(registered) - set(documented))
        assert not missing, f"not documented in {DOC.name}: {missing}"
        extra = sorted(set(documented) - set(registered))
        assert not extra, f"documented in {DOC.name} but not served: {extra}"
        async with ControlClient(daemon.config.control_socket) as client:
            answers: dict[str, str] = {}
            for op in sorted(documented, key=lambda o: o == "drain"):  # drain last
                try:
                    await client.call(op)
                    answers[op] = "ok"
                except ControlClientError as exc:
                    answers[op] = exc.code
        assert "unknown_op" not in answers.values(), answers


def test_error_codes_and_states_are_documented() -> None:
    """Section 7 lists exactly the server's error codes; section 5 exactly the turn states,
    with the right ones marked final."""
    text = DOC.read_text(encoding="utf-8")
    assert set(documented_rows(text, 7)) == set(ERROR_CODES)
    states = documented_rows(text, 5)
    state_rows = {k: v for k, v in states.items() if k in {s.value for s in TurnState}}
    assert set(state_rows) == {s.value for s in TurnState}
    finals = {k for k, v in state_rows.items() if v[0] == "yes"}
    assert finals == {s.value for s in FINAL_STATES}


async def test_example_client_works(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The doc's plain-socket client (section 9) opens a session and runs a turn."""
    code = re.search(r"```python\n(.*?)```", _section(DOC.read_text("utf-8"), 9), re.S)
    assert code is not None
    async with running(root) as daemon:
        source = code.group(1).replace(
            "/run/hunter/control.sock", str(daemon.config.control_socket)
        )
        await anyio.to_thread.run_sync(exec, compile(source, str(DOC), "exec"), {})
    assert capsys.readouterr().out == "succeeded hi\n\n"
