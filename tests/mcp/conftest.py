"""Fixtures of the MCP tests: a fresh demo root per test (a real daemon serves it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_daemon import demo_root


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-mcp-")
