"""Fixtures for the sandbox edge tests: a traversable root, installed packages, ledger reads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from sandbox.confine import landlock
from sandbox.confine.cgroups import detect_layout

SYSTEM_PYTHON = "/usr/bin/python3"


def sandbox_unavailable_reason() -> str | None:
    """Why real sandboxed turns cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root (uid drop, cgroups, network namespace)"
    if landlock.abi_version() < 6:
        return f"needs Landlock ABI >= 6, kernel has {landlock.abi_version()}"
    if detect_layout().unified is None:
        return "needs a writable cgroup v2 hierarchy (cgroup.kill)"
    return None


@pytest.fixture(scope="session")
def sandbox_reason() -> str | None:
    """Computed once: why real sandboxed turns cannot run here."""
    return sandbox_unavailable_reason()


@pytest.fixture
def sandboxed(sandbox_reason: str | None) -> None:
    """Skip (with the reason) where root, Landlock >= 6 or cgroup v2 are missing."""
    if sandbox_reason is not None:
        pytest.skip(sandbox_reason)


@pytest.fixture
def system_python() -> str:
    """A Python the unprivileged turn uid can run (the venv's lives under /root, mode 0700)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is absent (CI: apt-get install python3)")
    return SYSTEM_PYTHON


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog; put the defaults back after every test."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def world() -> Iterator[Path]:
    """A scratch directory every user can traverse (pytest's tmp_path parent is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hunter-sbx-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(world: Path) -> Path:
    """The runtime root (inside ``world``)."""
    path = world / "root"
    path.mkdir(mode=0o711)
    return path


@pytest.fixture
def install(root: Path) -> Callable[..., Path]:
    """Install a package: ``install("pkg", capabilities={...}, limits={...})``."""

    def _install(package_id: str, **manifest: object) -> Path:
        directory = root / "installed" / package_id
        directory.mkdir(parents=True, exist_ok=True)
        data: dict[str, object] = {"id": package_id}
        data.update(manifest)
        data.setdefault(
            "capabilities",
            {"read": [], "write": ["**"], "execute": ["/usr/bin/*", "/bin/*"], "forbidden": []},
        )
        (directory / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
        return directory

    return _install
