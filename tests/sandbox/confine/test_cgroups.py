"""Per-attempt cgroups: limits, membership, whole-tree kill, counters."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest

from sandbox.confine.cgroups import TurnCgroup, detect_layout

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
