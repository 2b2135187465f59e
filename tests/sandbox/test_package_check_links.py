"""``hunter package check`` with patterns that reach one directory by two paths (issue 21):
where ``/bin`` is a link to ``/usr/bin``, ``/bin/*`` and ``/usr/bin/*`` are one rule, listed
once with the spellings the manifest declared.

Here a temporary directory holds ``real/`` and ``link -> real``; the command runs as a user
runs it, ``python -m supervisor package check DIR``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``real/`` with an executable ``tool``, and ``link`` pointing at it (resolved paths)."""
    base = tmp_path.resolve()
    (base / "real").mkdir()
    tool = base / "real" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (base / "link").symlink_to(base / "real", target_is_directory=True)
    return base


def check(package: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "package", "check", str(package), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def package_declaring(tree: Path, capabilities: dict[str, list[str]]) -> Path:
    package = tree / "pkg"
    package.mkdir()
    (package / "manifest.json").write_text(json.dumps({"capabilities": capabilities}))
    return package


@pytest.mark.slow  # `hunter package check` as a process: seconds (not the quick tier)
def test_patterns_through_a_linked_directory_are_listed_once(tree: Path) -> None:
    """Declared through the link and directly, a pattern is one line naming both spellings and
    what they resolve to; declared only through the link, one line ``link/* (= real/*)``; an
    unlinked pattern is listed as before; ``--json`` lists each resolved pattern once."""
    real, link = tree / "real", tree / "link"
    package = package_declaring(
        tree,
        {
            "read": [f"{link}/*", f"{real}/*", "/nonexistent-hh/*"],
            "write": [f"{link}/out/**"],
            "execute": [f"{link}/tool", f"{real}/tool"],
            "forbidden": [],
        },
    )
    lines = check(package).splitlines()
    read = lines[lines.index("  read:") + 1 : lines.index("  write:")]
    write = lines[lines.index("  write:") + 1 : lines.index("  execute:")]
    execute = lines[lines.index("  execute:") + 1 : lines.index("  forbidden:")]
    assert read == [f"    {link}/*, {real}/* (= {real}/*)", "    /nonexistent-hh/*"]
    assert write == [f"    {link}/out/** (= {real}/out/**)"]
    assert execute == [f"    {link}/tool, {real}/tool (= {real}/tool)"]
    effective = json.loads(check(package, "--json"))["effective"]
    assert effective["read"] == [f"{real}/*", "/nonexistent-hh/*"]
    assert effective["write"] == [f"{real}/out/**"]
    assert effective["execute"] == [f"{real}/tool"]


def test_one_program_with_different_arguments_stays_two_rules(tree: Path) -> None:
    """Execute entries are commands: the same program with other argument patterns is another
    rule, so both stay listed (each with what its program resolves to)."""
    real, link = tree / "real", tree / "link"
    package = package_declaring(
        tree,
        {"read": [], "write": [], "execute": [f"{link}/tool --a", f"{real}/tool --b"]},
    )
    lines = check(package).splitlines()
    execute = lines[lines.index("  execute:") + 1 : lines.index("  forbidden:")]
    assert execute == [f"    {link}/tool --a (= {real}/tool)", f"    {real}/tool --b"]
