"""`hunter package install` and `hunter package list`: validated, atomic installs that a real
daemon then opens sessions with."""

from __future__ import annotations

import functools
import io
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from supervisor.cli import main
from supervisor.config import load_config
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon

_MANIFEST = {
    "id": "hello",
    "version": "2.1",
    "description": "says hello",
    "capabilities": {
        "read": ["/usr/**", "/etc/**"],
        "write": ["**"],
        "execute": ["/usr/bin/*", "/bin/*"],
        "forbidden": ["/etc/shadow"],
        "network": False,
    },
    "limits": {"memory_mb": 64, "pids": 32},
}


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh directory others can traverse (process turns drop to their own uid)."""
    path = Path(tempfile.mkdtemp(prefix="hh-pkg-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def source(base: Path) -> Path:
    """A package source directory: a manifest, a script, a data file in a subdirectory."""
    src = base / "src" / "hello"
    (src / "data").mkdir(parents=True)
    (src / "manifest.json").write_text(json.dumps(_MANIFEST), encoding="utf-8")
    (src / "run.sh").write_text("echo hello\n", encoding="utf-8")
    (src / "run.sh").chmod(0o755)
    (src / "data" / "greeting.txt").write_text("hi\n", encoding="utf-8")
    return src


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[None]:
    """An in-process daemon on *root*; its logs go to memory."""
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


async def hunter(*argv: str) -> int:
    """Run `hunter ARGV` in a worker thread (it starts its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(main, list(argv)))


async def test_installed_package_lists_and_opens_sessions(
    base: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed package is listed with its version and capabilities, and a daemon opens a
    session with it and runs a process turn in it."""
    root = base / "root"
    assert main(["package", "install", str(source), "--root", str(root)]) == 0
    assert "installed hello 2.1 at" in capsys.readouterr().out
    installed = root / "installed" / "hello"
    assert (installed / "data" / "greeting.txt").read_text() == "hi\n"
    assert (installed / "run.sh").stat().st_mode & 0o777 == 0o755
    assert main(["package", "list", "--root", str(root)]) == 0
    listing = capsys.readouterr().out
    assert "hello    2.1      read 2, write 1, execute 2, forbidden 1, network denied" in listing
    assert main(["package", "list", "--root", str(root), "--json"]) == 0
    (entry,) = orjson.loads(capsys.readouterr().out)["packages"]
    assert entry["package_id"] == "hello"
    assert entry["version"] == "2.1"
    assert entry["valid"] is True
    assert entry["capabilities"]["execute"] == ["/usr/bin/*", "/bin/*"]
    async with serving(root):
        assert await hunter("session", "open", "hello", "--root", str(root)) == 0
        sid = capsys.readouterr().out.strip()
        code = await hunter(
            "submit", "--root", str(root), "--session", sid, "--wait", "--", "echo", "hi"
        )
        assert code == 0, capsys.readouterr()


def test_same_content_is_a_no_op_and_different_content_needs_replace(
    base: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installing the same package again changes nothing; a changed one is refused (exit 1,
    naming --replace) until --replace, which swaps the new content in."""
    root = base / "root"
    assert main(["package", "install", str(source / "manifest.json"), "--root", str(root)]) == 0
    installed = root / "installed" / "hello"
    inode = installed.stat().st_ino
    capsys.readouterr()
    assert main(["package", "install", str(source), "--root", str(root)]) == 0
    assert "already installed" in capsys.readouterr().out
    assert installed.stat().st_ino == inode
    (source / "run.sh").write_text("echo changed\n", encoding="utf-8")
    assert main(["package", "install", str(source), "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "package 'hello' is installed with different content" in err
    assert "--replace" in err
    assert (installed / "run.sh").read_text() == "echo hello\n"
    assert main(["package", "install", str(source), "--root", str(root), "--replace"]) == 0
    assert "replaced hello 2.1" in capsys.readouterr().out
    assert (installed / "run.sh").read_text() == "echo changed\n"
    assert sorted(p.name for p in (root / "installed").iterdir()) == ["hello"]


def test_invalid_manifest_installs_nothing(
    base: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest error is the loader's own (file, JSON path, problem); nothing is copied."""
    bad = dict(_MANIFEST, capabilities={"reed": ["/usr/**"]})
    (source / "manifest.json").write_text(json.dumps(bad), encoding="utf-8")
    root = base / "root"
    assert main(["package", "install", str(source), "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"invalid manifest: {source}/manifest.json: $.capabilities.reed: unknown key" in err
    assert not (root / "installed" / "hello").exists()


def test_symlink_in_package_is_refused(
    base: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symlink inside the package is refused by name: it could point outside the package."""
    (source / "data" / "passwd").symlink_to("/etc/passwd")
    root = base / "root"
    assert main(["package", "install", str(source), "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"{source}/data/passwd: is a symlink" in err
    assert not (root / "installed" / "hello").exists()


def test_interrupted_install_is_invisible_and_cleaned(
    base: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A half-copied staging directory (an install that crashed) is not a package: `list`
    skips it, and the next install of that package removes it."""
    root = base / "root"
    leftover = root / "installed" / ".install-hello.abc123"
    leftover.mkdir(parents=True)
    (leftover / "manifest.json").write_text("{", encoding="utf-8")
    assert main(["package", "list", "--root", str(root)]) == 0
    assert "no packages installed" in capsys.readouterr().out
    assert main(["package", "install", str(source), "--root", str(root)]) == 0
    assert not leftover.exists()
    assert main(["package", "list", "--root", str(root)]) == 0
    assert "hello" in capsys.readouterr().out


def test_broken_installed_package_is_listed_with_its_error(
    base: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package directory copied by hand with a bad manifest is listed as INVALID with the
    loader's error; the root defaults to $HUNTER_ROOT."""
    root = base / "root"
    (root / "installed" / "handmade").mkdir(parents=True)
    (root / "installed" / "handmade" / "manifest.json").write_text("{}", encoding="utf-8")
    monkeypatch.setenv("HUNTER_ROOT", str(root))
    assert main(["package", "list"]) == 0
    shown = capsys.readouterr().out
    assert "handmade  -        INVALID: " in shown
    assert "manifest.json: $.capabilities: missing (required)" in shown
