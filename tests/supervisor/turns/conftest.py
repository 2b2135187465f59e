"""Fixtures of the turn core's tests: a real sandbox runtime with one package."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.runtime import Runtime, Session


@pytest.fixture
def sandbox_runtime() -> Iterator[Runtime]:
    """A sandbox runtime on a fresh root holding package ``pkg`` (writes anywhere in its area,
    runs /bin/true); the root is removed after."""
    world = Path(tempfile.mkdtemp(prefix="hh-turns-"))
    world.chmod(0o711)
    package = world / "root" / "installed" / "pkg"
    package.mkdir(parents=True)
    manifest = {"capabilities": {"read": [], "write": ["**"], "execute": ["/bin/true"]}}
    (package / "manifest.json").write_text(json.dumps(manifest))
    try:
        with Runtime(world / "root", config=None) as runtime:
            yield runtime
    finally:
        shutil.rmtree(world, ignore_errors=True)


@pytest.fixture
def session(sandbox_runtime: Runtime) -> Iterator[Session]:
    """An open session of ``pkg`` (its two ledgers exist)."""
    with sandbox_runtime.open_session("pkg") as opened:
        yield opened
