"""Fixtures of the console's tests: a fresh demo root, and an operators file with a resolver
(alice), a reader (rita) and a proxy-only resolver (proxied)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.live_console import write_operators
from tests.live_daemon import demo_root


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-console-")


@pytest.fixture
def operators(tmp_path: Path) -> Path:
    return write_operators(tmp_path / "operators.toml")
