"""How client commands find the daemon: `--socket`, `--root`, then `HUNTER_CONTROL_SOCKET` and
`HUNTER_ROOT` (the variables that configure the daemon), against a real daemon and socket."""

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
from supervisor.cli.exit_codes import EXIT_NO_DAEMON
from supervisor.config import load_config
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed."""
    base = Path(tempfile.mkdtemp(prefix="hh-env-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def serving(root: Path, *, control_socket: Path | None = None) -> AsyncIterator[None]:
    """An in-process daemon on *root* (optionally listening on *control_socket*)."""
    configure_logging(fmt="json", stream=io.StringIO())
    overrides: dict[str, object] = {"root": root}
    if control_socket is not None:
        overrides["control_socket"] = control_socket
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


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No daemon variables inherited, and a working directory with no ./.hunter."""
    monkeypatch.delenv("HUNTER_CONTROL_SOCKET", raising=False)
    monkeypatch.delenv("HUNTER_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


async def test_control_socket_variable_reaches_the_daemon(
    root: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With HUNTER_CONTROL_SOCKET set, `hunter status` needs neither --socket nor --root."""
    sock = root.parent / "elsewhere.sock"
    async with serving(root, control_socket=sock):
        clean_env.setenv("HUNTER_CONTROL_SOCKET", str(sock))
        assert await hunter("status", "--json") == 0
        status = orjson.loads(capsys.readouterr().out)
        assert status["daemon"]["root"] == str(root)


async def test_root_variable_reaches_the_daemon(
    root: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With only HUNTER_ROOT set, the client uses that root's run/control.sock."""
    async with serving(root):
        clean_env.setenv("HUNTER_ROOT", str(root))
        assert await hunter("session", "open", "demo") == 0
        sid = capsys.readouterr().out.strip()
        assert await hunter("session", "list", "--socket", str(root / "run" / "control.sock")) == 0
        assert sid in capsys.readouterr().out


async def test_flags_win_over_the_variables(
    root: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--root is used even when HUNTER_CONTROL_SOCKET names another (dead) socket."""
    async with serving(root):
        clean_env.setenv("HUNTER_CONTROL_SOCKET", str(root.parent / "dead.sock"))
        assert await hunter("status", "--root", str(root)) == 0
        assert f"root {root}" in capsys.readouterr().out


def test_a_dead_socket_from_the_variable_is_named(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listening where HUNTER_CONTROL_SOCKET points: exit 10, naming the path and the
    variable it came from."""
    dead = tmp_path / "nobody.sock"
    clean_env.setenv("HUNTER_CONTROL_SOCKET", str(dead))
    assert main(["executors"]) == EXIT_NO_DAEMON
    err = capsys.readouterr().err
    assert f"no daemon at {dead}" in err
    assert "came from $HUNTER_CONTROL_SOCKET" in err
