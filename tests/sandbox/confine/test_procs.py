"""Killing the processes of sandbox uids that no runtime's cgroup holds."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sandbox.confine.cgroups import TurnCgroup, detect_layout
from sandbox.confine.procs import kill_uid_processes, leaf_names, process_uids

pytestmark = pytest.mark.usefixtures("sandboxed")

#: far from the runtime's default uid range, so no other runtime on this host uses them
UID, OTHER_UID = 3_100_201, 3_100_202


def sleep_as(uid: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "1000"], user=uid, group=uid, extra_groups=[], cwd="/")


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_only_the_given_uids_are_killed() -> None:
    """Every process of the uid dies; a process of another uid lives on."""
    first, second, other = sleep_as(UID), sleep_as(UID), sleep_as(OTHER_UID)
    try:
        assert process_uids(first.pid) is not None
        assert kill_uid_processes({UID}) == 2
        assert first.wait(timeout=5) == second.wait(timeout=5) == -signal.SIGKILL
        assert other.poll() is None
        assert kill_uid_processes({UID}) == 0
    finally:
        stop(first, second, other)


def test_leaf_names_of_cgroup_paths() -> None:
    """The leaf names after a ``hunter-turns`` component, in any hierarchy's path."""
    paths = ("/a/hunter-turns/x", "/b/hunter-turns/y/nested", "/hunter-turns", "/other/z")
    assert leaf_names(paths) == {"x", "y"}


def test_root_and_the_callers_uid_are_never_targets() -> None:
    """uid 0 and the caller's own uid are dropped from the set, whatever the caller passes."""
    assert kill_uid_processes({0, os.geteuid()}) == 0


def test_a_process_held_by_a_runtime_cgroup_is_spared() -> None:
    """A process in a ``hunter-turns`` leaf belongs to a runtime that kills it by its cgroup
    (maybe another supervisor whose session got the same uid): the uid sweep leaves it,
    unless the caller says the leaf is not to be spared (its own)."""
    name = f"procs-{os.getpid()}"
    cg = TurnCgroup.create(detect_layout(), name, memory_bytes=64 << 20, pids=16)
    held = sleep_as(UID)
    try:
        for leaf in cg.dirs.values():
            (leaf / "cgroup.procs").write_text(str(held.pid))
        info = process_uids(held.pid)
        assert info is not None
        assert leaf_names(info[2]) == {name}
        assert kill_uid_processes({UID}) == 0
        assert kill_uid_processes({UID}, spare_leaf=lambda leaf: leaf != f"{name}x") == 0
        assert held.poll() is None
        assert kill_uid_processes({UID}, spare_leaf=lambda leaf: leaf != name) == 1
        assert held.wait(timeout=5) == -signal.SIGKILL
    finally:
        stop(held)
        deadline = time.monotonic() + 5
        while cg.members() and time.monotonic() < deadline:
            time.sleep(0.01)
        cg.remove()


def test_children_forked_meanwhile_are_caught() -> None:
    """A process of the uid that keeps starting children: the repeated sweep gets them all."""
    script = "while :; do sleep 1000 & sleep 0.01; done"
    spawner = subprocess.Popen(
        ["/bin/sh", "-c", script], user=UID, group=UID, extra_groups=[], cwd="/"
    )
    try:
        time.sleep(0.2)
        assert kill_uid_processes({UID}) >= 2
        assert spawner.wait(timeout=5) == -signal.SIGKILL
        time.sleep(0.1)
        assert kill_uid_processes({UID}) == 0
    finally:
        stop(spawner)
