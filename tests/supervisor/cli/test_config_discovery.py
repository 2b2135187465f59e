"""Client commands find the daemon from its config file (issue 21): `--config FILE` and
`$HUNTER_CONFIG` lead `hunter status`, `executors`, `session` and `package list` to the root the
file configures, in the documented order (docs/configuration.md, "How client commands find the
daemon"). The daemon reads the file; each `hunter` is a real process in a directory with no
./.hunter and no inherited HUNTER_* variable."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from supervisor.cli.exit_codes import EXIT_NO_DAEMON, EXIT_USAGE
from supervisor.config import load_config
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory others can traverse holding `r/` (a root with the demo package), the config
    files and `cwd/`, an empty working directory."""
    path = Path(tempfile.mkdtemp(prefix="hh-cfg-"))
    path.chmod(0o711)
    prepare_root(path / "r", fresh=True)
    (path / "cwd").mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def config_file(base: Path, name: str, text: str) -> Path:
    path = base / name
    path.write_text(text, encoding="utf-8")
    return path


@asynccontextmanager
async def serving(config: Path) -> AsyncIterator[None]:
    """An in-process daemon started from the config file *config* (and nothing else)."""
    configure_logging(fmt="json", stream=io.StringIO())
    daemon = Daemon(load_config(config, env={}), handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


async def hunter(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`hunter ARGV` as a process in *cwd*, with *env* and no other HUNTER_* variable."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HUNTER_") and k not in {"STATE_DIRECTORY", "RUNTIME_DIRECTORY"}
    }
    return await anyio.run_process(
        [sys.executable, "-m", "supervisor", *argv],
        cwd=cwd,
        env={**inherited, **(env or {})},
        check=False,
    )


def text(stream: bytes) -> str:
    return stream.decode()


async def test_the_config_file_leads_every_client_command_to_the_daemon(base: Path) -> None:
    """A daemon started with a config file whose root is elsewhere: `status --config F`,
    `HUNTER_CONFIG=F status`, `executors --config F`, `session open|list` and `package list`
    with `HUNTER_CONFIG` all reach that root, from a directory that has no ./.hunter."""
    root, cwd = base / "r", base / "cwd"
    conf = config_file(base, "hunter.toml", f'root = "{root}"\n')
    via_env = {"HUNTER_CONFIG": str(conf)}
    async with serving(conf):
        status = await hunter("status", "--json", "--config", str(conf), cwd=cwd)
        assert status.returncode == 0, text(status.stderr)
        assert orjson.loads(status.stdout)["daemon"]["root"] == str(root)

        status = await hunter("status", cwd=cwd, env=via_env)
        assert status.returncode == 0, text(status.stderr)
        assert f"root {root}" in text(status.stdout)

        executors = await hunter("executors", "--config", str(conf), cwd=cwd)
        assert executors.returncode == 0, text(executors.stderr)
        assert "no executors connected" in text(executors.stdout)

        opened = await hunter("session", "open", "demo", cwd=cwd, env=via_env)
        assert opened.returncode == 0, text(opened.stderr)
        sid = text(opened.stdout).strip()
        listed = await hunter("session", "list", "--config", str(conf), cwd=cwd)
        assert sid in text(listed.stdout)

        packages = await hunter("package", "list", "--json", cwd=cwd, env=via_env)
        assert packages.returncode == 0, text(packages.stderr)
        listing = orjson.loads(packages.stdout)
        assert listing["root"] == str(root)
        assert [p["package_id"] for p in listing["packages"]] == ["demo"]
        packages = await hunter("package", "list", "--config", str(conf), cwd=cwd)
        assert "demo" in text(packages.stdout)
    assert not (cwd / ".hunter").exists()


async def test_a_control_socket_set_in_the_file_is_where_clients_go(base: Path) -> None:
    """The file's `control_socket` (not under the root) is used as the daemon uses it."""
    root, cwd = base / "r", base / "cwd"
    sock = base / "elsewhere.sock"
    conf = config_file(base, "hunter.toml", f'root = "{root}"\ncontrol_socket = "{sock}"\n')
    async with serving(conf):
        status = await hunter("status", "--json", cwd=cwd, env={"HUNTER_CONFIG": str(conf)})
        assert status.returncode == 0, text(status.stderr)
        assert orjson.loads(status.stdout)["daemon"]["root"] == str(root)


async def test_a_root_given_is_read_with_its_own_hunter_toml(base: Path) -> None:
    """`hunter serve --root R` reads R/hunter.toml; a client given `--root R` reads it too, so
    a control socket that file moves out of R/run is where `status --root R` goes."""
    root, cwd = base / "r", base / "cwd"
    sock = base / "moved.sock"
    conf = config_file(root, "hunter.toml", f'root = "{root}"\ncontrol_socket = "{sock}"\n')
    async with serving(conf):
        assert not (root / "run" / "control.sock").exists()
        status = await hunter("status", "--json", "--root", str(root), cwd=cwd)
        assert status.returncode == 0, text(status.stderr)
        assert orjson.loads(status.stdout)["daemon"]["root"] == str(root)
    # nobody there: the message says the path came from the root's file
    gone = await hunter("status", "--root", str(root), cwd=cwd)
    assert gone.returncode == EXIT_NO_DAEMON
    err = text(gone.stderr)
    assert f"no daemon at {sock}" in err
    assert f"control_socket or runtime_dir key of {conf}" in err


async def test_flags_then_variables_then_the_file(base: Path) -> None:
    """--root wins over $HUNTER_CONFIG (whose root has no daemon); $HUNTER_ROOT wins over the
    file's root, as it does for `hunter serve`."""
    root, cwd = base / "r", base / "cwd"
    conf = config_file(base, "hunter.toml", f'root = "{root}"\n')
    other = config_file(base, "other.toml", f'root = "{base / "nobody"}"\n')
    async with serving(conf):
        status = await hunter(
            "status", "--root", str(root), cwd=cwd, env={"HUNTER_CONFIG": str(other)}
        )
        assert status.returncode == 0, text(status.stderr)
        status = await hunter(
            "status", cwd=cwd, env={"HUNTER_CONFIG": str(other), "HUNTER_ROOT": str(root)}
        )
        assert status.returncode == 0, text(status.stderr)
        # and --config names the file even when $HUNTER_CONFIG names another
        status = await hunter(
            "status", "--config", str(conf), cwd=cwd, env={"HUNTER_CONFIG": str(other)}
        )
        assert status.returncode == 0, text(status.stderr)


async def test_no_daemon_names_where_it_looked_and_why(base: Path) -> None:
    """Nothing serving: exit 10, naming the socket tried and where its path came from (the
    default ./.hunter of the working directory, or the root key of the file)."""
    cwd = base / "cwd"
    plain = await hunter("status", cwd=cwd)
    assert plain.returncode == EXIT_NO_DAEMON
    err = text(plain.stderr)
    assert f"no daemon at {cwd}/.hunter/run/control.sock" in err
    assert "the default ./.hunter" in err
    assert "$HUNTER_CONFIG" in err

    conf = config_file(base, "hunter.toml", f'root = "{base / "r"}"\n')
    configured = await hunter("executors", cwd=cwd, env={"HUNTER_CONFIG": str(conf)})
    assert configured.returncode == EXIT_NO_DAEMON
    err = text(configured.stderr)
    assert f"no daemon at {base}/r/run/control.sock" in err
    assert f"the root key of {conf}, named by $HUNTER_CONFIG" in err


async def test_an_unreadable_config_is_a_usage_error_unless_a_flag_settles_it(
    base: Path,
) -> None:
    """A config file that is needed and missing or invalid: exit 2 naming it; with --socket
    the file is not read at all."""
    cwd = base / "cwd"
    missing = base / "missing.toml"
    status = await hunter("status", "--config", str(missing), cwd=cwd)
    assert status.returncode == EXIT_USAGE
    assert f"cannot read {missing}" in text(status.stderr)

    bad = config_file(base, "bad.toml", "root = 3\n")
    packages = await hunter("package", "list", cwd=cwd, env={"HUNTER_CONFIG": str(bad)})
    assert packages.returncode == EXIT_USAGE
    assert "config key 'root'" in text(packages.stderr)

    dead = base / "dead.sock"
    status = await hunter("status", "--socket", str(dead), cwd=cwd, env={"HUNTER_CONFIG": str(bad)})
    assert status.returncode == EXIT_NO_DAEMON
    assert "the socket path came from --socket" in text(status.stderr)
