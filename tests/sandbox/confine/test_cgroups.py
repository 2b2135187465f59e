"""Per-attempt cgroups: limits, membership, whole-tree kill, counters."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sandbox.confine.cgroups import (
    CgroupLayout,
    CgroupReclaim,
    TurnCgroup,
    detect_layout,
    reclaim_cgroups,
)

pytestmark = pytest.mark.usefixtures("sandboxed")


def start_in(cg: TurnCgroup, script: str) -> subprocess.Popen[bytes]:
    """Start ``sh -c script`` inside the cgroup (joined before exec via preexec)."""
    fds = cg.open_procs_fds()

    def join() -> None:
        for fd in fds:
            os.write(fd, str(os.getpid()).encode())

    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", script],
            preexec_fn=join,  # noqa: PLW1509 - single-threaded test helper
            stdout=subprocess.PIPE,
        )
    finally:
        for fd in fds:
            os.close(fd)


def test_layout_and_levels() -> None:
    """The layout names a v2 dir for cgroup.kill and the memory/pids controllers."""
    layout = detect_layout()
    assert layout.kill_level == "cgroup.kill"
    assert layout.controller_level("memory") != "unavailable"
    assert layout.controller_level("pids") != "unavailable"


async def test_kill_all_reaches_setsid_double_forked_processes() -> None:
    """cgroup.kill kills a grandchild that left the session and ignores SIGTERM."""
    cg = TurnCgroup.create(detect_layout(), f"test-{os.getpid()}", memory_bytes=64 << 20, pids=32)
    try:
        proc = start_in(cg, "setsid sh -c 'trap \"\" TERM; sleep 60 & echo $!; wait' & wait")
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        proc.stdout.close()
        assert grandchild in cg.members()
        cg.signal_all(signal.SIGTERM)
        cg.kill_all()
        assert await cg.wait_empty(timeout_s=5)
        proc.wait()
        assert not psutil.pid_exists(grandchild) or (
            psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        )
        assert cg.resource_events() == {"oom_kill": 0, "pids_max": 0}
        assert cg.levels["tree_kill"] == "cgroup.kill"
    finally:
        cg.remove()
    assert cg.dirs == {}


async def test_pids_limit_is_counted() -> None:
    """Forking past pids.max is visible in the counters."""
    cg = TurnCgroup.create(detect_layout(), f"pids-{os.getpid()}", memory_bytes=64 << 20, pids=4)
    try:
        proc = start_in(cg, "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait")
        assert proc.stdout is not None
        proc.stdout.close()
        proc.wait()
        assert cg.resource_events()["pids_max"] > 0
        cg.kill_all()
        assert await cg.wait_empty(timeout_s=5)
    finally:
        cg.remove()


def test_reclaim_kills_and_removes_only_the_selected_leaves() -> None:
    """Picked leaves lose their processes (a setsid grandchild, a nested cgroup's member too)
    and are removed in every hierarchy, deepest first; a leaf not picked is left running."""
    layout = detect_layout()
    picked = TurnCgroup.create(layout, f"reclaim-{os.getpid()}", memory_bytes=64 << 20, pids=32)
    spared = TurnCgroup.create(layout, f"spared-{os.getpid()}", memory_bytes=64 << 20, pids=32)
    nested = picked.dirs["unified"] / "nested"
    nested.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        leader = start_in(picked, "setsid sleep 1000 & echo $!; exec sleep 1000")
        assert leader.stdout is not None
        grandchild = int(leader.stdout.readline())
        leader.stdout.close()
        deep = subprocess.Popen(["sleep", "1000"])
        (nested / "cgroup.procs").write_text(str(deep.pid))
        bystander = start_in(spared, "exec sleep 1000")
        assert bystander.stdout is not None
        bystander.stdout.close()
        procs += [leader, deep, bystander]

        found = reclaim_cgroups(layout, lambda name: name == picked.name, timeout_s=5)

        assert found == CgroupReclaim(cgroups=1, processes=3)
        assert leader.wait(timeout=5) == -signal.SIGKILL
        assert deep.wait(timeout=5) == -signal.SIGKILL
        assert not psutil.pid_exists(grandchild) or (
            psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        )
        assert not any(leaf.exists() for leaf in picked.dirs.values())
        assert bystander.poll() is None
        assert all(leaf.is_dir() for leaf in spared.dirs.values())
        assert reclaim_cgroups(layout, lambda name: name == picked.name) == CgroupReclaim()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        if nested.exists():
            nested.rmdir()
        picked.remove()
        spared.kill_all()
        spared.remove()


def test_reclaim_without_cgroup_kill_signals_each_member(tmp_path: Path) -> None:
    """A v1-only leaf (no ``cgroup.kill``) has its members killed one by one, then removed."""
    layout = detect_layout()
    if not layout.v1:
        pytest.skip("no v1 hierarchy here (pure cgroup v2: every leaf has cgroup.kill)")
    v1_only = CgroupLayout(v1=dict(layout.v1))
    cg = TurnCgroup.create(v1_only, f"v1only-{os.getpid()}", memory_bytes=64 << 20, pids=32)
    proc = start_in(cg, "sleep 1000 & exec sleep 1000")
    try:
        assert proc.stdout is not None
        proc.stdout.close()
        deadline = time.monotonic() + 5
        while len(cg.members()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        found = reclaim_cgroups(v1_only, lambda name: name == cg.name, timeout_s=5)
        assert found == CgroupReclaim(cgroups=1, processes=2)
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not any(leaf.exists() for leaf in cg.dirs.values())
    finally:
        proc.kill()
        proc.wait()
        cg.kill_all()
        cg.remove()
