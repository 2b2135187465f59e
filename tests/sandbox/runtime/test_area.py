"""A session's sandbox dirs: removed when it closes, never followed through a symlink."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.runtime import Runtime
from sandbox.runtime.directories import empty_directory, remove_directory

Installer = Callable[..., Path]
#: scratch in tmp/<sid> must be declared (FR-RT-016, fail closed)
SCRATCH = {"path": "tmp/**", "role": "scratch"}


@pytest.mark.usefixtures("sandboxed")
async def test_closing_a_session_removes_its_sandbox_dirs(root: Path, install: Installer) -> None:
    """What a turn cut off left in ``tmp/<sid>`` and ``output/<sid>`` (here: planted, as a
    kill would leave it) is removed with the dirs on close; ledgers and workspace stay, and
    the session resumes with fresh dirs."""
    install("pkg")
    with Runtime(root) as runtime:
        with runtime.open_session("pkg") as session:
            result = await session.run_process_turn(
                ["/bin/sh", "-c", "echo r > report.txt"],
                declared_outputs=["report.txt"],
                timeout_ms=10_000,
            )
            assert result.status == "succeeded"
            (session.tmp_dir / "deep" / "er").mkdir(parents=True)
            (session.tmp_dir / "deep" / "er" / "big").write_bytes(b"\0" * (1 << 20))
            (session.output_dir / "partial").write_text("x")
            sid, tmp_dir, output_dir = session.session_id, session.tmp_dir, session.output_dir
            ledger_dir = session.ledgers.session_dir / "ledger"
        assert not tmp_dir.exists()
        assert not output_dir.exists()
        assert {p.name for p in ledger_dir.iterdir()} >= {"exec.jsonl", "evidence.jsonl"}
        assert (root / "workspace" / sid / "report.txt").read_text() == "r\n"
        with runtime.resume_session(sid) as again:
            assert again.tmp_dir.stat().st_uid == again.uid
            result = await again.run_process_turn(
                ["/bin/sh", "-c", 'echo y > "$TMPDIR/y"; cat "$TMPDIR/y"'],
                declared_outputs=[SCRATCH],
                timeout_ms=10_000,
            )
            assert (result.status, result.stdout) == ("succeeded", "y\n")
        assert not tmp_dir.exists()


def test_remove_directory_never_follows_a_symlink(tmp_path: Path) -> None:
    """Links inside (to a file, to a dir) are unlinked, their targets kept; a symlink given as
    the directory itself is unlinked, not followed; the bytes of the regular files removed
    are counted."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep").write_bytes(b"k" * 10)
    (outside / "sub" / "keep").write_bytes(b"k" * 10)
    area = tmp_path / "area"
    (area / "d").mkdir(parents=True)
    (area / "d" / "file").write_bytes(b"f" * 1000)
    (area / "to-dir").symlink_to(outside / "sub")
    (area / "d" / "to-file").symlink_to(outside / "keep")
    os.mkfifo(area / "fifo")
    size = remove_directory(area)
    assert size == 1000  # regular files only
    assert not area.exists()
    assert (outside / "keep").read_bytes() == b"k" * 10
    assert (outside / "sub" / "keep").read_bytes() == b"k" * 10

    link = tmp_path / "link"
    link.symlink_to(outside)
    assert remove_directory(link) == 0
    assert not link.is_symlink()
    assert (outside / "keep").exists()
    assert remove_directory(tmp_path / "absent") == 0


def test_empty_directory_keeps_the_directory_and_counts_bytes(tmp_path: Path) -> None:
    """``empty_directory`` keeps its inode (Landlock rules are bound to it)."""
    area = tmp_path / "area"
    (area / "a" / "b").mkdir(parents=True)
    (area / "a" / "b" / "c").write_bytes(b"x" * 4096)
    (area / "top").write_bytes(b"y" * 5)
    inode = area.stat().st_ino
    assert empty_directory(area) == 4101
    assert list(area.iterdir()) == []
    assert area.stat().st_ino == inode
