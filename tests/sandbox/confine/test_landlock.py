"""Landlock rulesets built with ctypes, applied by the launcher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.confine import landlock
from sandbox.confine.spawn import SpawnRequest, reap, spawn

pytestmark = pytest.mark.usefixtures("sandboxed")


def test_abi_and_handled_rights() -> None:
    """The kernel reports an ABI; each version handles the rights it knows."""
    assert landlock.abi_version() >= 6
    assert landlock.FsAccess.REFER not in landlock.handled_fs_for_abi(1)
    assert landlock.FsAccess.TRUNCATE not in landlock.handled_fs_for_abi(2)
    assert landlock.FsAccess.IOCTL_DEV in landlock.handled_fs_for_abi(5)


def test_build_ruleset_reports_levels_and_missing_paths(tmp_path: Path) -> None:
    """Notes name the ABI, the network and scope levels, and rule paths that do not exist."""
    rules = landlock.LandlockRules(
        paths=((str(tmp_path), int(landlock.ACCESS_READ)), (str(tmp_path / "nope"), 1))
    )
    fd, notes = landlock.build_ruleset(rules)
    os.close(fd)
    assert notes["landlock_net"] == "enforced"
    assert notes["landlock_scope"] == "enforced"
    assert notes["landlock_missing_paths"] == str(tmp_path / "nope")
    with pytest.raises(landlock.LandlockUnavailableError, match=r"^\[Errno 38\] landlock is not"):
        landlock.build_ruleset(rules, abi=0)


def run_confined(rules: landlock.LandlockRules, script: str, cwd: Path) -> tuple[int, str]:
    """Run ``sh -c script`` under *rules* (as root, no other confinement); return rc, output."""
    fd, _ = landlock.build_ruleset(rules)
    out = os.memfd_create("out")
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        child = spawn(
            SpawnRequest(
                path="/bin/sh",
                argv=("sh", "-c", script),
                env=(("PATH", "/usr/bin:/bin"),),
                cwd=str(cwd),
                stdin_fd=null,
                stdout_fd=out,
                stderr_fd=out,
                landlock_fd=fd,
            )
        )
        status = reap(child)
        os.close(child.pidfd)
        return os.waitstatus_to_exitcode(status), os.pread(out, 65536, 0).decode()
    finally:
        for f in (fd, out, null):
            os.close(f)


def system_rules(*extra: tuple[str, int]) -> landlock.LandlockRules:
    """Read /usr etc., execute /usr/bin and the loader, plus *extra*."""
    paths = [
        ("/usr", int(landlock.ACCESS_READ | landlock.FsAccess.EXECUTE)),
        ("/etc/ld.so.cache", int(landlock.FsAccess.READ_FILE)),
        ("/dev/null", int(landlock.FsAccess.WRITE_FILE | landlock.FsAccess.READ_FILE)),
    ]
    for loader in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"):
        if os.path.exists(loader):
            paths.append((os.path.realpath(loader), int(landlock.ACCESS_EXEC)))
    return landlock.LandlockRules(paths=(*paths, *extra))


def test_even_root_cannot_write_outside_the_writable_tree(tmp_path: Path) -> None:
    """Landlock alone (still root): writes only under the granted directory."""
    box = tmp_path / "box"
    box.mkdir()
    rc, out = run_confined(
        system_rules((str(box), int(landlock.ACCESS_WRITE_TREE))),
        f"echo in > {box}/ok && echo out > {tmp_path}/bad",
        box,
    )
    assert rc != 0
    assert (box / "ok").read_text() == "in\n"
    assert not (tmp_path / "bad").exists()
    assert "Permission denied" in out


def test_symlinks_and_special_files_cannot_be_made(tmp_path: Path) -> None:
    """The writable tree grants regular files and dirs only."""
    box = tmp_path / "box"
    box.mkdir()
    _, out = run_confined(
        system_rules((str(box), int(landlock.ACCESS_WRITE_TREE))),
        "ln -s /etc/passwd l; mkfifo f; mkdir d && echo x > d/x && ls",
        box,
    )
    assert out.count("Permission denied") == 2
    assert sorted(os.listdir(box)) == ["d"]
