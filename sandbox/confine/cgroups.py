"""Per-attempt cgroups: memory and pids limits, whole-tree kill, resource-limit detection.

Layouts handled (detected at run time from /proc/self/mountinfo and /proc/self/cgroup):

* hybrid (this machine): v1 ``memory`` and ``pids`` controllers give the limits and the
  counters (``memory.oom_control: oom_kill``, ``pids.events: max``); the v2 hierarchy (no
  controllers) gives ``cgroup.kill``, which kills every member atomically, including
  processes that called setsid or double-forked.
* pure v2: ``memory.max``/``pids.max``/``memory.events``/``pids.events`` in one directory,
  when the supervisor's own cgroup can delegate those controllers to its children
  (it needs ``memory pids`` in its ``cgroup.subtree_control``; systemd: ``Delegate=yes``).
* none usable: no cgroup; limits fall back to rlimits and the tree kill to the process group
  plus a ``psutil`` descendant walk (weaker: a double-forked setsid process can escape it).

Each session gets its own leaf (``hunter-turns/<name>``) beneath the supervisor's own
cgroup, created before the first spawn (the child joins it itself, before exec) and removed
once it is empty. Several runtimes may share ``hunter-turns`` (two supervisors started from one
shell, a test run); the leaf *name* says which runtime made it (``Runtime.cgroup_prefix``), and
`reclaim_cgroups` removes only the leaves its caller selects by name: what a killed supervisor
left behind is reclaimed by the next runtime on the same root, never by another.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio

from sandbox.confine.procs import LEAF_PARENT

__all__ = ["CgroupLayout", "CgroupReclaim", "TurnCgroup", "detect_layout", "reclaim_cgroups"]

_LEAF_PARENT: Final = LEAF_PARENT


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where this process's cgroups are and which mechanisms work."""

    unified: Path | None = None  # v2 dir to create leaves under (kill, maybe limits)
    unified_controllers: frozenset[str] = frozenset()  # v2 controllers usable in leaves
    v1: dict[str, Path] = field(default_factory=dict)  # controller -> dir to create under

    @property
    def kill_level(self) -> str:
        """``cgroup.kill`` when v2 is usable, else ``procs`` (v1 member walk) or ``pgroup``."""
        if self.unified is not None:
            return "cgroup.kill"
        if self.v1:
            return "cgroup-procs"
        return "process-group"

    def controller_level(self, name: str) -> str:
        """``cgroup-v2``/``cgroup-v1`` for the controller, else ``unavailable``."""
        if name in self.unified_controllers:
            return "cgroup-v2"
        if name in self.v1:
            return "cgroup-v1"
        return "unavailable"

    def leaf_parents(self) -> tuple[Path, ...]:
        """Every directory leaves are created under (one per hierarchy in use)."""
        parents = [] if self.unified is None else [self.unified]
        parents += [p for p in self.v1.values() if p not in parents]
        return tuple(parents)


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    v2: Path | None = None
    v1: dict[str, Path] = {}
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    except OSError:
        return None, {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mount_point = Path(fields[4].replace("\\040", " "))
        fstype = rfields[0]
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for opt in rfields[2].split(","):
                if opt in ("memory", "pids"):
                    v1[opt] = mount_point
    return v2, v1


def _own_paths() -> tuple[str | None, dict[str, str]]:
    v2: str | None = None
    v1: dict[str, str] = {}
    try:
        text = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    except OSError:
        return None, {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        else:
            for ctl in parts[1].split(","):
                v1[ctl] = parts[2]
    return v2, v1


def _try_mkdir(path: Path) -> bool:
    try:
        path.mkdir(mode=0o755, exist_ok=True)
    except OSError:
        return False
    return True


def detect_layout() -> CgroupLayout:
    """Find the cgroup dirs this process may create turn leaves under."""
    v2_mount, v1_mounts = _mounts()
    v2_own, v1_own = _own_paths()
    unified: Path | None = None
    controllers: set[str] = set()
    if v2_mount is not None and v2_own is not None:
        own = v2_mount / v2_own.lstrip("/")
        parent = own / _LEAF_PARENT
        if os.access(own, os.W_OK) and _try_mkdir(parent):
            unified = parent
            try:
                available = set((own / "cgroup.controllers").read_text().split())
            except OSError:
                available = set()
            wanted = available & {"memory", "pids"}
            if wanted:
                with contextlib.suppress(OSError):
                    (own / "cgroup.subtree_control").write_text(
                        " ".join(f"+{c}" for c in sorted(wanted))
                    )
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(
                        " ".join(f"+{c}" for c in sorted(wanted))
                    )
                try:
                    enabled = set((parent / "cgroup.subtree_control").read_text().split())
                except OSError:
                    enabled = set()
                controllers = wanted & enabled
    v1: dict[str, Path] = {}
    for ctl in ("memory", "pids"):
        if ctl in controllers or ctl not in v1_mounts or ctl not in v1_own:
            continue
        own = v1_mounts[ctl] / v1_own[ctl].lstrip("/")
        parent = own / _LEAF_PARENT
        if os.access(own, os.W_OK) and _try_mkdir(parent):
            v1[ctl] = parent
    return CgroupLayout(unified=unified, unified_controllers=frozenset(controllers), v1=v1)


def _read(path: Path) -> str:
    """Read a small cgroup file with raw syscalls (hot path: several reads per turn)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode("ascii")
    finally:
        os.close(fd)


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = _read(path)
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


class TurnCgroup:
    """The cgroup leaf (or leaves, hybrid) of one attempt."""

    def __init__(self, layout: CgroupLayout, name: str) -> None:
        self._layout = layout
        self.name = name
        self.dirs: dict[str, Path] = {}  # "unified" / "memory" / "pids" -> leaf dir
        self.levels: dict[str, str] = {}
        #: the counters read when the last attempt ended with the leaf empty (`events_after`)
        self._settled: dict[str, int] | None = None

    @classmethod
    def create(cls, layout: CgroupLayout, name: str, *, memory_bytes: int, pids: int) -> TurnCgroup:
        """Make the leaf dirs and write the limits. Missing pieces show in ``levels``."""
        cg = cls(layout, name)
        try:
            if layout.unified is not None:
                leaf = layout.unified / name
                leaf.mkdir(mode=0o755)
                cg.dirs["unified"] = leaf
                if "memory" in layout.unified_controllers:
                    (leaf / "memory.max").write_text(str(memory_bytes))
                    with contextlib.suppress(OSError):
                        (leaf / "memory.swap.max").write_text("0")
                    cg.levels["memory"] = "cgroup-v2"
                if "pids" in layout.unified_controllers:
                    (leaf / "pids.max").write_text(str(pids))
                    cg.levels["pids"] = "cgroup-v2"
            for ctl, parent in layout.v1.items():
                leaf = parent / name
                leaf.mkdir(mode=0o755)
                cg.dirs[ctl] = leaf
                if ctl == "memory":
                    (leaf / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    with contextlib.suppress(OSError):
                        (leaf / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                    cg.levels["memory"] = "cgroup-v1"
                else:
                    (leaf / "pids.max").write_text(str(pids))
                    cg.levels["pids"] = "cgroup-v1"
        except BaseException:
            cg.remove()
            raise
        cg.levels.setdefault("memory", "unavailable")
        cg.levels.setdefault("pids", "unavailable")
        cg.levels["tree_kill"] = (
            "cgroup.kill"
            if "unified" in cg.dirs
            else ("cgroup-procs" if cg.dirs else "process-group")
        )
        return cg

    def open_procs_fds(self) -> list[int]:
        """Open each leaf's ``cgroup.procs`` for writing (the child writes its pid)."""
        fds: list[int] = []
        try:
            for leaf in self.dirs.values():
                fds.append(os.open(leaf / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def members(self) -> list[int]:
        """Pids currently in the attempt's cgroup."""
        pids: set[int] = set()
        # Every process joins all leaves, so the v2 leaf alone lists them when present.
        leaves = [self.dirs["unified"]] if "unified" in self.dirs else list(self.dirs.values())
        for leaf in leaves:
            try:
                text = _read(leaf / "cgroup.procs")
            except OSError:
                continue
            pids.update(int(x) for x in text.split())
        return sorted(pids)

    def signal_all(self, sig: int) -> int:
        """Send *sig* to every member; return how many were signalled."""
        count = 0
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                count += 1
        return count

    def kill_all(self) -> None:
        """Kill every member: ``cgroup.kill`` when there is one, else SIGKILL each member."""
        leaf = self.dirs.get("unified")
        if leaf is not None:
            try:
                fd = os.open(leaf / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
            else:
                try:
                    os.write(fd, b"1")
                finally:
                    os.close(fd)
                return
        # v1 only: freeze-free best effort; repeat until no member is left (see wait_empty).
        self.signal_all(signal.SIGKILL)

    def populated(self) -> bool:
        """Whether any process is still in the cgroup."""
        leaf = self.dirs.get("unified")
        if leaf is not None:
            return _read_kv(leaf / "cgroup.events").get("populated", 0) != 0
        return bool(self.members())

    async def wait_empty(self, *, timeout_s: float = 5.0) -> bool:
        """Wait until no member is left (killing stragglers again); True when empty.

        The kernel removes killed processes asynchronously; this waits with a short,
        growing sleep (bounded by *timeout_s*) because cgroup emptiness has no fd to wait on
        that anyio can poll portably.
        """
        delay = 0.0005
        with anyio.move_on_after(timeout_s):
            while self.populated():
                self.kill_all()
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)
            return True
        return not self.populated()

    def resource_events(self) -> dict[str, int]:
        """Counters that say a limit was hit: ``oom_kill`` and ``pids_max``."""
        out = {"oom_kill": 0, "pids_max": 0}
        mem = self.dirs.get("memory")
        if mem is not None:
            out["oom_kill"] = _read_kv(mem / "memory.oom_control").get("oom_kill", 0)
        elif "memory" in self._layout.unified_controllers and "unified" in self.dirs:
            events = _read_kv(self.dirs["unified"] / "memory.events")
            out["oom_kill"] = max(events.get("oom_kill", 0), events.get("oom", 0))
        pids = self.dirs.get("pids")
        if pids is not None:
            out["pids_max"] = _read_kv(pids / "pids.events").get("max", 0)
        elif "pids" in self._layout.unified_controllers and "unified" in self.dirs:
            out["pids_max"] = _read_kv(self.dirs["unified"] / "pids.events").get("max", 0)
        return out

    def events_before(self) -> dict[str, int]:
        """`resource_events` at the start of an attempt: those read when the last attempt
        ended (`events_after`: the leaf has been empty since, so no counter can have moved),
        else read now."""
        settled, self._settled = self._settled, None
        return settled if settled is not None else self.resource_events()

    def events_after(self) -> dict[str, int]:
        """`resource_events` once an attempt ended and the leaf is empty; kept as the next
        attempt's starting point."""
        self._settled = now = self.resource_events()
        return now

    def remove(self) -> None:
        """Remove the leaf dirs (they must be empty; EBUSY leaves them and is ignored)."""
        for key, leaf in list(self.dirs.items()):
            try:
                leaf.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                continue
            del self.dirs[key]


@dataclass(frozen=True, slots=True)
class CgroupReclaim:
    """What `reclaim_cgroups` found: leaves removed, processes killed, leaves left (busy)."""

    cgroups: int = 0
    processes: int = 0
    busy: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def _procs(leaf: Path) -> set[int]:
    try:
        text = (leaf / "cgroup.procs").read_text(encoding="ascii")
    except OSError:  # gone meanwhile, or not a cgroup dir
        return set()
    return {int(x) for x in text.split()}


def _kill_members(leaf: Path, pids: set[int]) -> None:
    """Kill the processes of *leaf* (listed: *pids*) and of the cgroups beneath it.

    ``cgroup.kill`` kills them all at once (a process that forks meanwhile cannot escape);
    without it (v1), each listed pid gets SIGKILL and the caller repeats until none is left.
    """
    try:
        fd = os.open(leaf / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cgroup_dirs(top: Path) -> list[Path]:
    """*top* and every cgroup beneath it (no symlinks on cgroupfs; none followed)."""
    found = [top]
    for dirpath, dirnames, _files in os.walk(top):
        found.extend(Path(dirpath) / name for name in dirnames)
    return found


def reclaim_cgroups(
    layout: CgroupLayout, select: Callable[[str], bool], *, timeout_s: float = 5.0
) -> CgroupReclaim:
    """Kill the processes of the leaves *select* picks by name, then remove those leaves.

    Looks at the direct children of each of the layout's leaf parents (``hunter-turns`` of
    every hierarchy) and nothing else; a picked leaf is taken with everything beneath it.
    Members are killed (``cgroup.kill``, else SIGKILL per pid) until every picked cgroup is
    empty or *timeout_s* passed; then the directories are removed, deepest first. A leaf
    that cannot be removed is reported in ``busy``, never raised: this runs at start.
    Blocking (a short, growing sleep while killed processes exit); run it off the event loop.
    """
    tops: list[Path] = []
    errors: list[str] = []
    for parent in layout.leaf_parents():
        try:
            with os.scandir(parent) as entries:
                tops += [
                    Path(e.path)
                    for e in entries
                    if e.is_dir(follow_symlinks=False) and select(e.name)
                ]
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{parent}: {exc.strerror}")
    if not tops:
        return CgroupReclaim(errors=tuple(errors))
    dirs = [d for top in tops for d in _cgroup_dirs(top)]
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        members = {leaf: _procs(leaf) for leaf in dirs}  # all read before any is killed
        alive = {leaf: pids for leaf, pids in members.items() if pids}
        if not alive or time.monotonic() >= deadline:
            break
        for leaf, pids in alive.items():
            killed |= pids
            try:
                _kill_members(leaf, pids)
            except OSError as exc:
                errors.append(f"{leaf}: {exc.strerror}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    removed: set[str] = set()
    busy: list[str] = []
    for leaf in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        try:
            leaf.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:
            busy.append(f"{leaf}: {exc.strerror}")
            continue
        if leaf in tops:
            removed.add(leaf.name)
    return CgroupReclaim(
        cgroups=len(removed),
        processes=len(killed),
        busy=tuple(busy),
        errors=tuple(dict.fromkeys(errors)),
    )
