"""Finding and killing the processes of sandbox uids that no cgroup holds any more.

A turn's processes run as the session's unprivileged uid. Normally its cgroup holds all of
them and ``cgroup.kill`` ends them together; this is the backstop for what no cgroup holds
(a layout without cgroups, or an older run), used when a runtime reclaims what a killed
supervisor left behind. Processes are found in ``/proc`` (any of the real, effective, saved or
filesystem uids), opened as pidfds and re-checked before the signal, so a pid reused in
between is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Collection, Iterable
from typing import Final

__all__ = ["LEAF_PARENT", "kill_uid_processes", "leaf_names", "process_uids", "reap_orphans"]

_PROC: Final = "/proc"
#: The directory turn leaves are made in (``sandbox.confine.cgroups``).
LEAF_PARENT: Final = "hunter-turns"


def process_uids(pid: int) -> tuple[frozenset[int], bool, tuple[str, ...]] | None:
    """``(uids, zombie, cgroup paths)`` of process *pid*, or None when it is gone.

    *uids* holds its real, effective, saved and filesystem uids; the cgroup paths are those
    of ``/proc/<pid>/cgroup`` (one per hierarchy).
    """
    try:
        with open(f"{_PROC}/{pid}/status", encoding="utf-8", errors="replace") as handle:
            status = handle.read()
        with open(f"{_PROC}/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            cgroups = tuple(line.split(":", 2)[-1] for line in handle.read().splitlines())
    except (FileNotFoundError, ProcessLookupError):
        return None
    uids: frozenset[int] = frozenset()
    zombie = False
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "State":
            zombie = value.split()[:1] in (["Z"], ["X"])
        elif key == "Uid":
            with contextlib.suppress(ValueError):
                uids = frozenset(int(x) for x in value.split())
    return uids, zombie, cgroups


def _pids() -> list[int]:
    with os.scandir(_PROC) as entries:
        return [int(e.name) for e in entries if e.name.isdigit()]


def leaf_names(cgroups: Iterable[str], parent: str = LEAF_PARENT) -> frozenset[str]:
    """The names of the ``<parent>/<name>`` leaves among the cgroup paths of a process."""
    names: set[str] = set()
    for path in cgroups:
        parts = path.split("/")
        names.update(parts[i + 1] for i in range(len(parts) - 1) if parts[i] == parent)
    return frozenset(names)


def _spare_every_leaf(name: str) -> bool:
    del name
    return True


def kill_uid_processes(
    uids: Collection[int],
    *,
    spare_leaf: Callable[[str], bool] = _spare_every_leaf,
    rounds: int = 20,
) -> int:
    """SIGKILL every live process running as one of *uids*; return how many were killed.

    A process in a ``hunter-turns/<name>`` leaf for which ``spare_leaf(name)`` is true is left
    alone: it belongs to a turn some runtime holds by its cgroup (that runtime kills it, or
    reclaims the leaf at its next start), possibly another supervisor whose session happened
    to get the same uid. By default every leaf is spared. uid 0 and this process's own uid
    are never signalled. Repeats the scan (at most *rounds* times) until one finds no new
    process, so children forked during a scan are caught by the next one.
    """
    wanted = {u for u in uids if u > 0 and u != os.geteuid()}
    if not wanted:
        return 0
    me = os.getpid()

    def target(pid: int) -> bool:
        info = process_uids(pid)
        if info is None:
            return False
        found, zombie, cgroups = info
        if zombie or not found & wanted:
            return False
        return not any(spare_leaf(name) for name in leaf_names(cgroups))

    killed: set[int] = set()
    for _ in range(rounds):
        new = 0
        for pid in _pids():
            if pid == me or not target(pid):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except (ProcessLookupError, OSError):
                continue
            try:
                if target(pid):  # the pidfd pins the process: re-check what it is now
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    new += pid not in killed
                    killed.add(pid)
            finally:
                os.close(pidfd)
        if not new:
            break
    return len(killed)


def reap_orphans(sandbox_uid: Callable[[int], bool]) -> int:
    """Reap the zombie children of this process that ran as a sandbox uid; how many.

    The runtime is the child subreaper (``PR_SET_CHILD_SUBREAPER``): where a turn has no PID
    namespace of its own, what it orphaned is re-parented here and, once killed, waits here as
    a zombie. Only zombies whose uid is a sandbox uid are reaped (``waitpid`` of that pid), so
    no other child's exit status is ever taken from its owner.
    """
    me = os.getpid()
    reaped = 0
    for pid in _pids():
        try:
            with open(f"{_PROC}/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] != b"Z" or int(fields[1]) != me:
            continue
        info = process_uids(pid)
        if info is None or not any(sandbox_uid(uid) for uid in info[0]):
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
    return reaped
