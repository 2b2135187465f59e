"""Fixtures of the sandbox runtime tests: a strict runtime on the test root, a session of the
default test package (write anything, execute /usr/bin and /bin), a directory outside."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.runtime import Runtime, Session


@pytest.fixture
def runtime(root: Path) -> Iterator[Runtime]:
    """A strict runtime on the test root."""
    with Runtime(root) as rt:
        yield rt


@pytest.fixture
def session(runtime: Runtime, install: Callable[..., Path]) -> Iterator[Session]:
    """A session of the default test package (no socket or network grant)."""
    install("pkg")
    with runtime.open_session("pkg") as sess:
        yield sess


@pytest.fixture
def outside(world: Path) -> Path:
    """A world-writable directory outside the sandbox (so only the sandbox can stop writes)."""
    path = world / "outside"
    path.mkdir()
    path.chmod(0o777)
    return path
