"""Tests of ledger.files: durable directory creation."""

from __future__ import annotations

from pathlib import Path

from ledger.files import fsync_dir, make_dirs


def test_make_dirs_creates_nested_and_is_idempotent(tmp_path: Path) -> None:
    """make_dirs creates every missing level and tolerates existing ones."""
    target = tmp_path / "a/b/c"
    make_dirs(target)
    make_dirs(target)
    assert target.is_dir()
    fsync_dir(target)
