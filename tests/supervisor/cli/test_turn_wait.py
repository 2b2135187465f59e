"""`hunter turn wait N --timeout S` when S passes first (issue 21): it says so on stderr, with
the turn's state now and what to do next, and exits 8, not the 1 of a failed turn."""

from __future__ import annotations

import functools
import io
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from supervisor.cli import main
from supervisor.cli.exit_codes import EXIT_NOT_SETTLED, STATE_EXIT_CODES
from supervisor.config import load_config
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed."""
    base = Path(tempfile.mkdtemp(prefix="hh-wait-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[None]:
    """An in-process daemon on *root* with no executor: an instruction turn waits for one (for
    an hour: `executors.queue_wait_s`), so it does not settle while the test looks at it."""
    configure_logging(fmt="json", stream=io.StringIO())
    overrides = {"root": root, "executors.queue_wait_s": 3600}
    daemon = Daemon(load_config(None, env={}, overrides=overrides), handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


async def hunter(*argv: str) -> int:
    """Run `hunter ARGV` in a worker thread (it starts its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(main, list(argv)))


async def test_wait_timeout_says_the_turn_did_not_settle(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A turn still waiting for an executor: `turn wait N --timeout 0.2` prints the turn, says
    on stderr that it did not settle within the timeout, its state and how to go on, and exits
    8, a code no final state has. Once the turn settles (cancelled), waiting again exits with
    that state's code and says nothing of a timeout."""
    r = str(root)
    async with serving(root):
        assert await hunter("session", "open", "demo", "--root", r) == 0
        sid = capsys.readouterr().out.strip()
        submitted = ("submit", "--root", r, "--session", sid, "--command", "READ", "--json")
        assert await hunter(*submitted, "--selector", "#main") == 0
        turn_id = orjson.loads(capsys.readouterr().out)["turn"]["turn_id"]

        code = await hunter("turn", "wait", str(turn_id), "--timeout", "0.2", "--root", r, "--json")
        captured = capsys.readouterr()
        assert code == EXIT_NOT_SETTLED
        assert EXIT_NOT_SETTLED not in STATE_EXIT_CODES.values()
        state = orjson.loads(captured.out)["state"]
        message = captured.err.splitlines()[-1]
        assert f"turn {turn_id} did not settle within the --timeout of 0.2s" in message
        assert f"it is {state} now" in message
        assert f"`hunter turn wait {turn_id}`" in message
        assert f"`hunter turn show {turn_id}`" in message
        assert f"Exit code {EXIT_NOT_SETTLED}" in message

        assert await hunter("turn", "cancel", str(turn_id), "--root", r) == 0
        capsys.readouterr()
        code = await hunter("turn", "wait", str(turn_id), "--timeout", "30", "--root", r)
        captured = capsys.readouterr()
        assert code == STATE_EXIT_CODES["cancelled"]
        assert "did not settle" not in captured.err
