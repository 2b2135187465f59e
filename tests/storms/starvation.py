"""CPU starvation for a nemesis run: busy-loop processes, and optionally a CPU quota.

`BusyLoops` starts N processes that spin (``while True: pass``) at the daemons' priority, for
the whole run or a window of it: on a 2-core machine two of them take half of the CPU from the
daemons, the executors and the server, and a daemon's event loop runs late (its lease renewals
too). `CpuQuota` puts the daemons into a cgroup of their own with a CPU bandwidth limit
(cgroup v2 ``cpu.max`` where the unified hierarchy offers the cpu controller, else the v1
``cpu`` controller's ``cpu.cfs_quota_us``); `CpuQuota.create` says why when neither is
writable, and the run goes on without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BusyLoops", "CpuQuota"]

_PERIOD_US = 100_000


@dataclass
class BusyLoops:
    """N spinning processes (each in a process group of its own, so they can be killed)."""

    count: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return bool(self.processes)

    def start(self) -> None:
        for _ in range(self.count - len(self.processes)):
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        while self.processes:
            process = self.processes.pop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _unified_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


def _v1_cpu_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines():
        left, _, right = line.partition(" - ")
        parts = right.split()
        if parts[:1] == ["cgroup"] and len(parts) >= 3 and "cpu" in parts[2].split(","):
            return Path(left.split()[4])
    return None


@dataclass
class CpuQuota:
    """A cgroup with a CPU bandwidth limit that daemons are moved into (`add`)."""

    path: Path
    version: int
    members: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, percent: int) -> tuple[CpuQuota | None, str]:
        """A cgroup limited to *percent* of one CPU, or None and why not."""
        quota = max(1000, _PERIOD_US * percent // 100)
        name = f"hunter-nemesis-{os.getpid()}"
        unified = _unified_mount()
        if unified is not None:
            try:
                controllers = (unified / "cgroup.controllers").read_text().split()
            except OSError:
                controllers = []
            if "cpu" in controllers:
                path = unified / name
                try:
                    path.mkdir()
                    (path / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        path.rmdir()
                    return None, f"cgroup v2 cpu.max not writable: {exc}"
                return cls(path, 2), f"cgroup v2 {path} cpu.max {quota} {_PERIOD_US}"
        v1 = _v1_cpu_mount()
        if v1 is None:
            return None, "no cgroup with the cpu controller is mounted"
        path = v1 / name
        try:
            path.mkdir()
            (path / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None, f"cgroup v1 cpu controller not writable: {exc}"
        return cls(path, 1), f"cgroup v1 {path} cfs_quota_us {quota} / {_PERIOD_US}"

    def add(self, pid: int) -> None:
        """Move *pid* (a daemon) into the limited cgroup."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.procs").write_text(str(pid))
            self.members.append(pid)

    def remove(self) -> None:
        """Move what is left back to the parent and remove the cgroup."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.path.parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()
