"""The `hunter` client commands against a real (in-process) daemon, and their exit codes."""

from __future__ import annotations

import argparse
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

from supervisor.cli import build_parser, main
from supervisor.cli.commands import EXIT_NO_DAEMON
from supervisor.config import load_config
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, with the demo package installed."""
    base = Path(tempfile.mkdtemp(prefix="hh-cmd-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[None]:
    """An in-process daemon on *root*; its logs go to memory, not the captured stdout."""
    configure_logging(fmt="json", stream=io.StringIO())
    daemon = Daemon(load_config(None, env={}, overrides={"root": root}), handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


_CORE_COMMANDS = (
    "serve",
    "session",
    "submit",
    "status",
    "executors",
    "turn",
    "escalations",
    "check-ledgers",
    "drain",
    "demo",
)


async def hunter(*argv: str) -> int:
    """Run `hunter ARGV` in a worker thread (it starts its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(main, list(argv)))


async def test_no_daemon_exit_code_and_message(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a daemon every client command exits 10 and says how to start one."""
    assert await hunter("status", "--root", str(root)) == EXIT_NO_DAEMON
    err = capsys.readouterr().err
    assert f"no daemon at {root}/run/control.sock (no such socket file)" in err
    assert "hunter serve --root DIR" in err


async def test_session_submit_wait_show_status(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """open a session, submit process turns with --wait, show, status, escalations."""
    r = str(root)
    async with serving(root):
        assert await hunter("session", "open", "demo", "--root", r) == 0
        sid = capsys.readouterr().out.strip()
        assert sid.startswith("SES-")
        code = await hunter(
            "submit", "--root", r, "--session", sid, "--wait",
            "--declare-output", "out.txt:report",
            "--", "sh", "-c", 'echo hi > "$HUNTER_OUTPUT_DIR/out.txt"',
        )  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0
        assert "succeeded" in captured.out
        assert "turn 1: " in captured.err
        assert await hunter("submit", "--root", r, "--session", sid, "--wait", "--", "false") == 1
        capsys.readouterr()
        assert await hunter("turn", "show", "2", "--root", r) == 0
        shown = capsys.readouterr().out
        assert "state:   failed" in shown
        assert "FAILURE_NOT_RETRIED" in shown
        assert await hunter("status", "--root", r) == 0
        table = capsys.readouterr().out
        assert "succeeded" in table
        assert "failed" in table
        assert await hunter("status", "--json", "--socket", f"{r}/run/control.sock") == 0
        status = orjson.loads(capsys.readouterr().out)
        assert status["turns_by_state"] == {"failed": 1, "succeeded": 1}
        assert await hunter("executors", "--root", r) == 0
        assert "no executors connected" in capsys.readouterr().out
        assert await hunter("escalations", "list", "--root", r) == 0
        assert "no escalated turns" in capsys.readouterr().out
        assert await hunter("check-ledgers", "--root", r) == 0
        assert capsys.readouterr().out.count("ok  ") == 2
        assert await hunter("session", "list", "--root", r) == 0
        assert sid in capsys.readouterr().out


async def test_session_tenant_and_priority(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`session open --tenant --priority` records both; `session list` shows them (and "-" for
    a session opened without); a priority out of bounds is refused naming the field."""
    r = str(root)
    async with serving(root):
        labelled = ("--tenant", "acme.eu-1", "--priority", "3")
        assert await hunter("session", "open", "demo", "--root", r, *labelled) == 0
        sid = capsys.readouterr().out.strip()
        assert await hunter("session", "open", "demo", "--root", r) == 0
        plain = capsys.readouterr().out.strip()
        assert await hunter("session", "list", "--root", r) == 0
        lines = capsys.readouterr().out.splitlines()
        assert "TENANT" in lines[0]
        assert "PRIORITY" in lines[0]
        assert [line.split()[3:5] for line in lines if sid in line] == [["acme.eu-1", "3"]]
        assert [line.split()[3:5] for line in lines if plain in line] == [["-", "-"]]
        assert await hunter("session", "list", "--json", "--root", r) == 0
        listed = orjson.loads(capsys.readouterr().out)["sessions"]
        assert {s["session_id"]: (s["tenant"], s["priority"]) for s in listed} == {
            sid: ("acme.eu-1", 3),
            plain: (None, None),
        }
        assert await hunter("session", "open", "demo", "--root", r, "--priority", "11") == 1
        assert "priority" in capsys.readouterr().err


async def test_refused_request_exits_1(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A request the daemon refuses exits 1 with the error code and message."""
    async with serving(root):
        assert await hunter("turn", "show", "99", "--root", str(root)) == 1
    assert "unknown_turn: no turn 99" in capsys.readouterr().err


def test_config_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`hunter config show` prints the effective config; a bad file exits 2 naming the key."""
    good = tmp_path / "good.toml"
    good.write_text("[retry]\nbase_delay_ms = 7\n")
    assert main(["config", "show", "--json", "--config", str(good), "--root", str(tmp_path)]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["retry"]["base_delay_ms"] == 7
    assert shown["root"] == str(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[retry]\nbase_delay_ms = -1\n")
    assert main(["config", "show", "--config", str(bad)]) == 2
    assert "retry.base_delay_ms" in capsys.readouterr().err


def test_commands_are_listed_in_help_order() -> None:
    """`hunter --help` lists the daemon core's commands in their registration order."""
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    names = [name for name in subparsers.choices if name in _CORE_COMMANDS]
    assert names == list(_CORE_COMMANDS)
