"""What a previous run on this root left behind, reclaimed when a runtime starts.

A supervisor killed with SIGKILL leaves its turns' cgroups (with whatever still ran in them),
processes of its sessions' uids and the sessions' sandbox directories. The next runtime on the
same root takes them back before any session is opened or resumed (`reclaim_leftovers`):

1. cgroups: the leaves under ``hunter-turns`` (every hierarchy) whose name starts with this
   root's ``cgroup_prefix``, or, from before the prefix existed, with the id of one of this
   root's sessions; their processes are killed, then the leaves removed, deepest first;
2. processes: every process running as a uid that owns one of this root's sandbox directories
   (a sandbox uid of the runtime's configuration), unless it is in another runtime's leaf;
3. scratch: ``tmp/<sid>`` and ``output/<sid>`` of every session, removed (never followed
   symlinks; a session disk mounted on them and its tmpfs in ``state/disks`` detached). A
   session still open is resumed later with fresh, empty ones: its ledgers (``planes/``) and
   its workspace are never touched.

Only what carries this root's mark is touched: leaves of other runtimes sharing
``hunter-turns``, other uids and anything outside ``<root>/tmp`` and ``<root>/output`` are not.
The caller makes sure no other runtime is live on the root (`Runtime` holds
``<root>/state/sandbox.lock``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.confine.cgroups import CgroupLayout, reclaim_cgroups
from sandbox.confine.mounts import mounts_under, unmount
from sandbox.confine.procs import kill_uid_processes
from sandbox.runtime.directories import empty_directory, remove_directory
from sandbox.session_ids import is_session_id

__all__ = ["AREAS", "Leftovers", "reclaim_leftovers"]

#: The runtime's per-session sandbox directories under its root.
AREAS = ("tmp", "output")


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What `reclaim_leftovers` found and removed (the ``sandbox_leftovers_reclaimed`` event)."""

    cgroups: int = 0
    processes: int = 0
    scratch_dirs: int = 0
    scratch_bytes: int = 0
    sessions: int = 0
    cgroups_busy: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        """Whether anything was left behind."""
        return bool(
            self.cgroups or self.processes or self.scratch_dirs or self.cgroups_busy or self.errors
        )

    def to_log(self) -> dict[str, object]:
        """The fields of the log event."""
        return {
            "cgroups": self.cgroups,
            "processes": self.processes,
            "scratch_dirs": self.scratch_dirs,
            "scratch_bytes": self.scratch_bytes,
            "sessions": self.sessions,
            "cgroups_busy": list(self.cgroups_busy),
            "errors": list(self.errors),
        }


def _area_dirs(root: Path) -> list[tuple[Path, int]]:
    """``(dir, owner uid)`` of every ``tmp/<sid>`` and ``output/<sid>`` directory."""
    found: list[tuple[Path, int]] = []
    for area in AREAS:
        try:
            with os.scandir(root / area) as entries:
                names = [e.name for e in entries if is_session_id(e.name)]
        except FileNotFoundError:
            continue
        for name in sorted(names):
            path = root / area / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                found.append((path, st.st_uid))
    return found


def _old_leaf_session(name: str) -> str:
    """The session id in a leaf name of the form ``<sid>-<6 hex>`` (before the prefix)."""
    sid, _, suffix = name.rpartition("-")
    return sid if len(suffix) == 6 and is_session_id(sid) else ""


def reclaim_leftovers(
    root: Path,
    *,
    layout: CgroupLayout,
    cgroup_prefix: str,
    sandbox_uid: Callable[[int], bool],
    kill_timeout_s: float = 5.0,
) -> Leftovers:
    """Kill and remove what a previous run on *root* left (see the module docstring).

    Order: cgroups (their processes die at once), then the sandbox uids' processes that no
    cgroup held, then the directories (nothing is left to write into them). Blocking; errors
    are collected in the result, never raised (the runtime still starts).
    """
    areas = _area_dirs(root)
    sessions = {path.name for path, _uid in areas}

    def ours(name: str) -> bool:
        return name.startswith(cgroup_prefix) or _old_leaf_session(name) in sessions

    cgroups = reclaim_cgroups(layout, ours, timeout_s=kill_timeout_s)
    errors = list(cgroups.errors)
    uids = {uid for _path, uid in areas if sandbox_uid(uid)}
    processes = 0
    if uids:
        try:
            processes = kill_uid_processes(uids, spare_leaf=lambda name: not ours(name))
        except OSError as exc:
            errors.append(f"processes of uids {sorted(uids)}: {exc}")
    scratch_dirs = 0
    scratch_bytes = 0
    for path, _uid in areas:
        try:
            if os.path.ismount(path):  # on a session disk (confine/mounts.py)
                scratch_bytes += empty_directory(path)
                unmount(path)
            scratch_bytes += remove_directory(path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            continue
        scratch_dirs += 1
    disks = root / "state" / "disks"
    try:
        for point in mounts_under(disks):
            unmount(Path(point))
        if disks.is_dir():
            for entry in os.listdir(disks):
                remove_directory(disks / entry)
    except OSError as exc:
        errors.append(f"{disks}: {exc.strerror or exc}")
    return Leftovers(
        cgroups=cgroups.cgroups,
        processes=cgroups.processes + processes,
        scratch_dirs=scratch_dirs,
        scratch_bytes=scratch_bytes,
        sessions=len(sessions),
        cgroups_busy=cgroups.busy,
        errors=tuple(errors),
    )
