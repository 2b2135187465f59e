"""Capability matching: normalisation, symlinks, forbidden wins, ``**`` (FR-RT-003/010)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.capabilities import (
    compile_capabilities,
    compile_pattern,
    literal_prefix,
    normalise,
    resolve_command,
)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("/a/**", "/a", True),
        ("/a/**", "/a/b/c", True),
        ("/a/**", "/ab", False),
        ("/a/*", "/a/b", True),
        ("/a/*", "/a/b/c", False),
        ("/a/**/c", "/a/c", True),
        ("/a/**/c", "/a/x/y/c", True),
        ("/a/**/c", "/a/x/y/cc", False),
        ("/a/?.txt", "/a/1.txt", True),
        ("/a/?.txt", "/a/12.txt", False),
        ("/a/[ab].txt", "/a/b.txt", True),
        ("/a/[!ab].txt", "/a/b.txt", False),
        ("/a/x**y", "/a/x/y", False),
        ("/a/x**y", "/a/xzzy", True),
        ("/**", "/", True),
        ("/**", "/anything/at/all", True),
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    """``*`` stays in a segment, ``**`` spans zero or more whole segments."""
    assert compile_pattern(pattern, base=Path("/")).matches(path) is expected


def test_relative_patterns_are_anchored_at_the_workspace(tmp_path: Path) -> None:
    """A relative pattern matches under the workspace only."""
    caps = compile_capabilities(
        read=[], write=["out/**"], execute=[], forbidden=[], workspace=tmp_path
    )
    assert caps.check_write(tmp_path / "out" / "x.json").allowed
    assert caps.check_write("out/x.json").allowed
    assert not caps.check_write(tmp_path / "elsewhere").allowed
    assert not caps.check_write("/out/x.json").allowed


def test_dotdot_is_normalised_before_matching(tmp_path: Path) -> None:
    """``out/../../etc/passwd`` is /etc/passwd-ish, not under out/."""
    caps = compile_capabilities(
        read=[], write=["out/**"], execute=[], forbidden=[], workspace=tmp_path
    )
    check = caps.check_write("out/../../escape")
    assert not check.allowed
    assert check.path == str(tmp_path.parent / "escape")
    assert normalise("a/../../b", base=Path("/x/y")) == "/x/b"


def test_symlinks_are_resolved_before_matching(tmp_path: Path) -> None:
    """A symlink inside an allowed tree pointing at a forbidden file is forbidden."""
    allowed = tmp_path / "data"
    secret = tmp_path / "secret"
    allowed.mkdir()
    secret.mkdir()
    (secret / "key").write_text("k")
    (allowed / "link").symlink_to(secret / "key")
    caps = compile_capabilities(
        read=[f"{allowed}/**"],
        write=[],
        execute=[],
        forbidden=[f"{secret}/**"],
        workspace=tmp_path,
    )
    check = caps.check_read(allowed / "link")
    assert not check.allowed
    assert check.capability == "capabilities.forbidden"
    assert check.path == str(secret / "key")


def test_forbidden_wins_over_read_write_execute(tmp_path: Path) -> None:
    """A path matching both an allow pattern and forbidden is denied."""
    caps = compile_capabilities(
        read=["/**"], write=["**"], execute=["/**"], forbidden=["**/.git/**"], workspace=tmp_path
    )
    for check in (
        caps.check_read(tmp_path / ".git" / "config"),
        caps.check_write(".git/hooks/pre-commit"),
        caps.check_execute(tmp_path / "a" / ".git" / "x"),
    ):
        assert not check.allowed
        assert check.capability == "capabilities.forbidden"
        assert check.matched == "**/.git/**"


def test_pattern_prefix_is_resolved(tmp_path: Path) -> None:
    """The literal part of a pattern is resolved, so a symlinked directory still matches."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    pat = compile_pattern(f"{tmp_path}/alias/*.txt", base=tmp_path)
    assert pat.absolute == f"{real}/*.txt"
    assert pat.matches(f"{real}/a.txt")
    assert literal_prefix("/a/b/*/c") == "/a/b"


def test_bare_command_names_resolve_on_path(tmp_path: Path) -> None:
    """``sh`` in execute allows the file ``sh`` resolves to on the turn's PATH."""
    caps = compile_capabilities(
        read=[], write=[], execute=["sh", "no-such-command-xyz"], forbidden=[], workspace=tmp_path
    )
    real_sh = resolve_command("sh", cwd=tmp_path)
    assert real_sh is not None
    assert real_sh == os.path.realpath(real_sh)
    assert caps.check_execute(real_sh).allowed
    assert len(caps.execute) == 1
    assert resolve_command("no-such-command-xyz", cwd=tmp_path) is None
    assert resolve_command("bad\0name", cwd=tmp_path) is None


def test_nul_bytes_are_rejected() -> None:
    """A path with a NUL byte is never matched."""
    with pytest.raises(ValueError, match=r"^path contains a NUL byte$"):
        normalise("a\0b")
