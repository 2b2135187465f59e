"""Fixtures of the executor hub tests (the harness itself is ``harness.py``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for sockets (AF_UNIX paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hh-exec-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
