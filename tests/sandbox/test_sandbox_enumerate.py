"""Realized-write enumeration: hashes, special files, no symlink following, swaps (FR-RT-015)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import threading
from pathlib import Path

from sandbox.enumerate import enumerate_writes


def test_regular_files_are_hashed_with_size(tmp_path: Path) -> None:
    """Every regular file is listed with its relative path, sha256 and size, sorted."""
    out = tmp_path / "out"
    (out / "d" / "e").mkdir(parents=True)
    (out / "b.txt").write_bytes(b"bee")
    (out / "d" / "e" / "a.bin").write_bytes(b"\0" * 3_000_000)
    surface = enumerate_writes({"output": out, "tmp": tmp_path / "missing"})
    assert surface.problems == ()
    assert [(w.area, w.path, w.size) for w in surface.writes] == [
        ("output", "b.txt", 3),
        ("output", "d/e/a.bin", 3_000_000),
    ]
    assert surface.writes[0].sha256 == hashlib.sha256(b"bee").hexdigest()
    assert surface.writes[1].sha256 == hashlib.sha256(b"\0" * 3_000_000).hexdigest()
    assert surface.total_bytes == 3_000_003
    assert set(surface.in_area("output")) == {"b.txt", "d/e/a.bin"}


def test_special_files_are_problems_and_never_opened(tmp_path: Path) -> None:
    """Symlinks (to files and dirs), hard links, FIFOs and sockets are reported, not read."""
    out = tmp_path / "out"
    out.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")
    (out / "flink").symlink_to(secret / "key")
    (out / "dlink").symlink_to(secret)
    (out / "h1").write_text("x")
    os.link(out / "h1", out / "h2")
    os.mkfifo(out / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(out / "sock"))
        surface = enumerate_writes({"output": out})
    kinds = {p.path: p.kind for p in surface.problems}
    assert kinds == {
        "flink": "symlink",
        "dlink": "symlink",
        "h1": "hardlink",
        "h2": "hardlink",
        "fifo": "fifo",
        "sock": "socket",
    }
    assert surface.writes == ()


def test_symlink_swap_during_enumeration_never_reads_outside(tmp_path: Path) -> None:
    """A racer swapping files and dirs for symlinks never gets outside content hashed."""
    out = tmp_path / "out"
    out.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "f").write_bytes(b"SECRET")
    secret_hash = hashlib.sha256(b"SECRET").hexdigest()
    (out / "d").mkdir()
    stop = threading.Event()

    def racer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            with contextlib.suppress(OSError):
                tmp = out / f".f{i}"
                if i % 2:
                    tmp.symlink_to(secret / "f")
                else:
                    tmp.write_bytes(b"mine")
                os.replace(tmp, out / "f")
            with contextlib.suppress(OSError):
                tmp = out / f".d{i}"
                if i % 2:
                    tmp.symlink_to(secret)
                else:
                    tmp.mkdir()
                    (tmp / "f").write_bytes(b"mine")
                trash = out / f".trash{i}"
                os.rename(out / "d", trash)
                os.rename(tmp, out / "d")
                if trash.is_symlink():
                    trash.unlink()
                else:
                    shutil.rmtree(trash)

    thread = threading.Thread(target=racer)
    thread.start()
    seen_problem = False
    try:
        for _ in range(300):
            surface = enumerate_writes({"output": out})
            assert all(w.sha256 != secret_hash for w in surface.writes)
            seen_problem = seen_problem or bool(surface.problems)
    finally:
        stop.set()
        thread.join()
    assert seen_problem


def test_deeply_nested_tree_is_walked(tmp_path: Path) -> None:
    """A tree deeper than Python's recursion limit is walked completely."""
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # pathlib/os.makedirs would recurse as deep as the tree
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    leaf = out.joinpath(*["d"] * 1100)
    (leaf / "f").write_bytes(b"deep")
    try:
        surface = enumerate_writes({"output": out})
    finally:
        (leaf / "f").unlink()
        while leaf != out:
            leaf.rmdir()
            leaf = leaf.parent
    assert surface.problems == ()
    assert [w.path for w in surface.writes] == ["d/" * 1100 + "f"]
