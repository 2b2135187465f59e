"""Fixtures for the sandbox edge tests: a traversable root, installed packages, ledger reads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from sandbox import landlock
from sandbox.cgroups import detect_layout

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


_REASON = sandbox_unavailable_reason()
needs_sandbox = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
needs_python = pytest.mark.skipif(
    not os.access(SYSTEM_PYTHON, os.X_OK),
    reason=f"{SYSTEM_PYTHON} (a system interpreter the unprivileged turn uid can read) is absent",
)


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


Installer = Callable[..., Path]


@pytest.fixture
def install(root: Path) -> Installer:
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


def read_ledger(path: Path) -> list[dict[str, object]]:
    """Parse a JSONL ledger file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def turn_entries(session_dir: Path, turn_number: int) -> dict[str, list[Mapping[str, object]]]:
    """Entries of one turn in both ledgers, by ledger name."""
    out: dict[str, list[Mapping[str, object]]] = {}
    for name in ("exec", "evidence"):
        entries = read_ledger(session_dir / "ledger" / f"{name}.jsonl")
        out[name] = [e for e in entries if e.get("turn_number") == turn_number]
    return out
