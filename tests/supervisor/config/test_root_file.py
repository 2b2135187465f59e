"""`hunter serve --root DIR` without ``--config`` reads ``DIR/hunter.toml`` (what `./scripts/demo
--root DIR` writes) and says which file it read: `daemon_ready`'s ``config_file`` and `hunter
config show`."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import orjson
import pytest

from supervisor.config import ROOT_CONFIG_NAME, config_file_for
from supervisor.control.client import ControlClient
from supervisor.demo.root import prepare_root

#: the environment of a daemon started here: none of the test runner's HUNTER_* variables
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")}


def test_the_file_named_wins_then_the_variable_then_the_roots(tmp_path: Path) -> None:
    """--config, else $HUNTER_CONFIG, else ROOT/hunter.toml when it is there (ROOT: --root,
    else $HUNTER_ROOT, else $STATE_DIRECTORY's first), else no file."""
    root = tmp_path / "root"
    named = tmp_path / "named.toml"
    assert config_file_for(config=None, root=root, env={}) is None  # nothing there yet
    prepare_root(root, fresh=True)
    in_root = root / ROOT_CONFIG_NAME
    assert config_file_for(config=None, root=root, env={}) == in_root
    assert config_file_for(config=named, root=root, env={}) == named
    env = {"HUNTER_CONFIG": str(named)}
    assert config_file_for(config=None, root=root, env=env) == named
    assert config_file_for(config=None, root=None, env={"HUNTER_ROOT": str(root)}) == in_root
    state = {"STATE_DIRECTORY": f"{root}:{tmp_path / 'other'}"}
    assert config_file_for(config=None, root=None, env=state) == in_root
    assert config_file_for(config=None, root=tmp_path / "elsewhere", env={}) is None


def test_config_show_says_which_file_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hunter config show --root DIR` shows the root's file in force and names it."""
    from supervisor.cli import main

    for name in [k for k in os.environ if k.startswith("HUNTER_")]:
        monkeypatch.delenv(name)
    root = tmp_path / "root"
    prepare_root(root, fresh=True)  # the demo's file: queue_wait_s = 3.0
    assert main(["config", "show", "--root", str(root)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# read {root / ROOT_CONFIG_NAME}\n")
    assert "queue_wait_s = 3.0" in shown
    assert main(["config", "check", "--root", str(root)]) == 0
    assert capsys.readouterr().out == f"configuration OK: {root / ROOT_CONFIG_NAME}\n"
    assert main(["config", "show", "--root", str(tmp_path / "bare")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("# read no configuration file (defaults and HUNTER_* variables)\n")
    assert "queue_wait_s = 60.0" in shown


async def test_serve_reads_the_roots_file_and_names_it(tmp_path: Path) -> None:
    """A real `hunter serve --root DIR` with no --config: the control socket the root's file
    names is where it listens, and `daemon_ready` names the file."""
    root = tmp_path / "root"
    socket = tmp_path / "elsewhere.sock"
    prepare_root(root, fresh=True, config_text=f'control_socket = "{socket}"\n')
    proc = await anyio.open_process(
        [sys.executable, "-m", "supervisor", "serve", "--root", str(root), "--log-format", "json"],
        env=CLEAN_ENV,
    )
    try:
        with anyio.fail_after(30):
            while not socket.exists():
                assert proc.returncode is None, "the daemon exited at start"
                await anyio.sleep(0.05)
            async with ControlClient(socket) as client:
                status = await client.call("status")
        assert status["daemon"]["root"] == str(root)
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await proc.wait() == 0
        assert proc.stdout is not None
        output = b""
        async for chunk in proc.stdout:
            output += chunk
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()
    events = [orjson.loads(line) for line in output.splitlines() if line.startswith(b"{")]
    (ready,) = [e for e in events if e["event"] == "daemon_ready"]
    assert ready["config_file"] == str(root / ROOT_CONFIG_NAME)
    assert ready["control_socket"] == str(socket)
