"""A session's confined area: its directories, its uid, its Landlock ruleset and its cgroup.

``tmp/<sid>`` and ``output/<sid>`` are owned by the session's unprivileged uid (mode 0700),
emptied before every attempt and when a turn ends, and removed when the session closes; the
Landlock ruleset (writes only there, reads only under the read roots, ``forbidden`` carved out)
and the empty network namespace are built once and reused while the directories keep their
inodes; the cgroup leaf (named with the runtime's ``cgroup_prefix``) is created on first use.
``env`` and ``rlimits`` are what every confined run of the session gets.
"""

from __future__ import annotations

import functools
import os
import resource
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread
import structlog

from sandbox.capabilities import CompiledCapabilities, compile_capabilities, has_glob
from sandbox.confine import landlock, seccomp
from sandbox.confine.cgroups import TurnCgroup
from sandbox.confine.mounts import mount_session_disk, unmount_session_disk
from sandbox.confine.spawn import close_quietly, new_network_namespace
from sandbox.enumerate import RealizedWrite
from sandbox.errors import SandboxUnavailableError
from sandbox.packages import Package
from sandbox.policy.declarations import DeclaredOutput
from sandbox.promote import PromotedOutput, StagedOutputs, promote_outputs, stage_outputs
from sandbox.runtime.attempt import run_confined
from sandbox.runtime.directories import all_empty, empty_directory, remove_directory
from sandbox.runtime.view import RuntimeView

if TYPE_CHECKING:
    from sandbox.runs import ConfinedRun

__all__ = [
    "SessionArea",
    "implicit_forbidden",
    "session_capabilities",
]

_log = structlog.get_logger("sandbox.runtime.area")

_DEV_NULL_ACCESS: Final = int(
    landlock.FsAccess.READ_FILE
    | landlock.FsAccess.WRITE_FILE
    | landlock.FsAccess.TRUNCATE
    | landlock.FsAccess.IOCTL_DEV  # isatty(): TCGETS answers ENOTTY
)
#: A turn has no controlling terminal (the launcher calls setsid): opening /dev/tty fails with
#: ENXIO whatever Landlock says, so shells that try it are not capability violations.
_DEV_TTY_ACCESS: Final = int(landlock.FsAccess.READ_FILE | landlock.FsAccess.WRITE_FILE)
_MAX_CARVE_RULES: Final = 4096
_FILTER: Final = seccomp.build_filter()
#: Less free space than this on the session disk after a turn means it hit the bound.
_DISK_FULL_SLACK: Final = 64 << 10


def _forbidden_may_match_beneath(caps: CompiledCapabilities, root: str) -> bool:
    for pat in caps.forbidden:
        prefix = pat.prefix
        if prefix == root or prefix.startswith(root.rstrip("/") + "/"):
            return True
        if has_glob(pat.absolute) and (prefix == "/" or root.startswith(prefix + "/")):
            return True
    return False


def _carve(roots: Iterable[str], caps: CompiledCapabilities, access: int) -> list[tuple[str, int]]:
    """Landlock rules granting *access* under *roots* except where ``forbidden`` matches.

    Landlock cannot deny inside an allowed tree, so a root that contains forbidden paths is
    replaced by rules for its children, recursively, skipping forbidden entries and symlinks.
    Raises ``SandboxUnavailableError`` when that would take more than 4096 rules.
    """
    rules: list[tuple[str, int]] = []

    def visit(path: str) -> None:
        if caps.forbidden_match(path) is not None:
            return
        if not _forbidden_may_match_beneath(caps, path) or not os.path.isdir(path):
            rules.append((path, access))
        else:
            with os.scandir(path) as entries:
                children = [e.path for e in entries if not e.is_symlink()]
            for child in sorted(children):
                visit(child)
        if len(rules) > _MAX_CARVE_RULES:
            raise SandboxUnavailableError(
                mechanisms={"landlock": f"forbidden patterns inside {path} need too many rules"}
            )

    for root in dict.fromkeys(roots):
        if os.path.lexists(root):
            visit(os.path.realpath(root))
    return rules


def implicit_forbidden(runtime: RuntimeView) -> list[str]:
    """What no turn may touch whatever its package says: the runtime's own trees and sockets,
    and the configured ``denied_paths``."""
    root = runtime.root
    forbidden = [
        f"{root}/{sub}/**" for sub in ("planes", "state", "installed", "run", "tmp", "output")
    ]
    forbidden += [str(p) for p in runtime.forbidden_sockets]
    forbidden += list(runtime.config.denied_paths)
    return forbidden


def session_capabilities(
    runtime: RuntimeView, package: Package, workspace: Path, *, also_forbidden: Sequence[str] = ()
) -> CompiledCapabilities:
    """The package's capabilities, with the runtime's own trees and sockets forbidden (and
    *also_forbidden*: the unprivileged daemon's trees, when this runtime is its helper's)."""
    caps = package.capabilities
    return compile_capabilities(
        read=caps.read,
        write=caps.write,
        execute=caps.execute,
        forbidden=(*caps.forbidden, *implicit_forbidden(runtime), *also_forbidden),
        workspace=workspace,
        search_path=runtime.config.turn_path,
    )


class SessionArea:
    """The directories, uid, Landlock ruleset, network namespace and cgroup of one session.

    Nothing is acquired by the constructor; `open` takes a uid from the runtime's pool and
    prepares the directories, `close` gives back everything (idempotent).
    """

    def __init__(
        self,
        runtime: RuntimeView,
        *,
        session_id: str,
        package: Package,
        capabilities: CompiledCapabilities,
    ) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.package = package
        self.capabilities = capabilities
        self.tmp_dir = runtime.root / "tmp" / session_id
        self.output_dir = runtime.root / "output" / session_id
        #: the session disk (confine/mounts.py) when the runtime mounts one
        self.disk_dir = runtime.root / "state" / "disks" / session_id
        self.disk_mounted = False
        self.uid = self.gid = -1
        self.netns_fd = -1
        self.ruleset_fd = -1
        self.cgroup: TurnCgroup | None = None
        self._ruleset_notes: dict[str, str] = {}
        self._area_inodes: dict[str, tuple[int, int]] = {}
        self._closed = False
        #: where the manifest's ``env_allow`` names take their values (the helper sets the
        #: daemon's own environment here)
        self.env_source: Mapping[str, str] = os.environ

    # -- ConfinedArea (sandbox/runtime/confined_area.py) -----------------------------------

    async def confinement(self) -> dict[str, str]:
        return self.ensure_confinement()

    async def run_attempt(
        self,
        *,
        exe: str,
        argv: Sequence[str],
        declared: tuple[DeclaredOutput, ...],
        turn: int,
        attempt_no: int,
        timeout_s: float,
    ) -> ConfinedRun:
        return await run_confined(
            self,
            exe=exe,
            argv=list(argv),
            declared=declared,
            turn=turn,
            attempt_no=attempt_no,
            timeout_s=timeout_s,
        )

    async def promote(
        self, writes: Sequence[RealizedWrite], workspace: Path, *, done: list[PromotedOutput]
    ) -> None:
        if not writes:  # nothing declared to promote: no worker thread
            return
        # Each promoted file goes onto *done* in the worker thread: a cancellation meanwhile
        # does not lose the record of what reached the workspace.
        await anyio.to_thread.run_sync(
            functools.partial(promote_outputs, self.output_dir, writes, workspace, done=done)
        )

    async def stage(self, writes: Sequence[RealizedWrite], workspace: Path) -> StagedOutputs:
        if not writes:  # nothing declared to stage: no worker thread
            return StagedOutputs([], [])
        return await anyio.to_thread.run_sync(
            stage_outputs, self.output_dir, tuple(writes), workspace
        )

    async def empty(self) -> None:
        if not all_empty((self.tmp_dir, self.output_dir)):
            await anyio.to_thread.run_sync(self.empty_areas)

    # -- the area itself ---------------------------------------------------------------------

    def open(self) -> None:
        """Take the session's uid and prepare its directories (``close`` undoes both)."""
        self.uid, self.gid = self.runtime.allocate_uid(self.session_id)
        self.prepare()
        if self.runtime.levels.get("disk") == "tmpfs":
            self._mount_disk()

    def _areas(self) -> dict[str, Path]:
        return {"tmp": self.tmp_dir, "output": self.output_dir}

    def _mount_disk(self) -> None:
        """Put ``tmp/<sid>`` and ``output/<sid>`` on one tmpfs of ``disk_mb`` (a hard bound)."""
        limits = self.package.manifest.limits
        size = (limits.disk_mb or self.runtime.config.disk_mb) << 20
        mount_session_disk(
            self.disk_dir, self._areas(), size_bytes=size, uid=self.uid, gid=self.gid
        )
        self.disk_mounted = True
        self._invalidate_ruleset()  # the rules are bound to the (new) directory inodes
        self.prepare()

    def disk_full(self) -> bool:
        """Whether the session disk has (almost) no space left: a turn hit the hard bound."""
        if not self.disk_mounted:
            return False
        st = os.statvfs(self.disk_dir)
        return st.f_bavail * st.f_frsize < _DISK_FULL_SLACK

    def close(self) -> None:
        """Release the fds, the cgroup, the directories and the uid (idempotent).

        ``tmp/<sid>`` and ``output/<sid>`` are removed once the cgroup's processes are
        killed: nothing of a closed session stays on disk but its ledgers and workspace (a
        session resumed later gets fresh ones). A failure to remove them is logged, never
        raised (the session's ledgers still have to be closed).
        """
        if self._closed:
            return
        self._closed = True
        close_quietly([fd for fd in (self.netns_fd, self.ruleset_fd) if fd >= 0])
        self.netns_fd = self.ruleset_fd = -1
        self.drop_cgroup()
        try:
            if self.disk_mounted:
                self.disk_mounted = False
                unmount_session_disk(self.disk_dir, self._areas())
            for area in (self.tmp_dir, self.output_dir):
                remove_directory(area)
        except OSError as exc:
            _log.error(
                "scratch_not_emptied", session_id=self.session_id, when="close", error=str(exc)
            )
        if self.uid > 0:
            self.runtime.release_uid(self.uid)

    def empty_areas(self) -> int:
        """Empty ``tmp/<sid>`` and ``output/<sid>`` (kept, as `prepare` keeps them); the bytes
        removed. Called when a turn ends, after its writes were enumerated and promoted."""
        removed = 0
        for area in (self.tmp_dir, self.output_dir):
            try:
                st = os.lstat(area)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                removed += empty_directory(area)
        return removed

    def _make_area(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if self.uid >= 0:
            os.chown(path, self.uid, self.gid)
        os.chmod(path, 0o700)

    def prepare(self) -> None:
        """Empty ``tmp/<sid>`` and ``output/<sid>`` (every attempt starts clean).

        The directories themselves are kept (Landlock rules are bound to their inodes);
        their contents are removed without following symlinks, and owner and mode reset.
        A directory that is missing or was replaced is recreated and the session's Landlock
        ruleset is rebuilt for the new inode.
        """
        for area in (self.tmp_dir, self.output_dir):
            st = os.lstat(area) if os.path.lexists(area) else None
            if st is not None and not stat.S_ISDIR(st.st_mode):
                area.unlink()
                st = None
            if st is None:
                self._make_area(area)
                self._invalidate_ruleset()
                continue
            empty_directory(area)
            if self.uid >= 0 and (st.st_uid, st.st_gid) != (self.uid, self.gid):
                os.chown(area, self.uid, self.gid)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(area, 0o700)
            if (st.st_ino, st.st_dev) != self._area_inodes.get(str(area), (st.st_ino, st.st_dev)):
                self._invalidate_ruleset()
            self._area_inodes[str(area)] = (st.st_ino, st.st_dev)

    def turn_cgroup(self) -> TurnCgroup:
        """The session's cgroup leaf, created on first use and reused by its attempts.

        Only one attempt of a session runs at a time and each ends with the leaf empty, so
        reuse is safe; limit counters are read as deltas around each attempt.
        """
        if self.cgroup is None:
            limits = self.package.manifest.limits
            cfg = self.runtime.config
            self.cgroup = TurnCgroup.create(
                self.runtime.layout,
                f"{self.runtime.cgroup_prefix}{self.session_id}-{os.urandom(3).hex()}",
                memory_bytes=(limits.memory_mb or cfg.memory_mb) << 20,
                pids=limits.pids or cfg.pids,
            )
        return self.cgroup

    def drop_cgroup(self) -> None:
        """Stop using the session's cgroup (kill what is left, remove it if empty)."""
        cg, self.cgroup = self.cgroup, None
        if cg is not None:
            cg.kill_all()
            cg.remove()

    def _invalidate_ruleset(self) -> None:
        if self.ruleset_fd >= 0:
            os.close(self.ruleset_fd)
            self.ruleset_fd = -1
        self._area_inodes.clear()

    @property
    def network_granted(self) -> bool:
        """Whether the manifest grants network access."""
        return self.package.capabilities.network

    @property
    def unix_sockets_granted(self) -> bool:
        """Whether the manifest grants connecting to pathname Unix sockets."""
        return self.package.capabilities.unix_sockets

    def seccomp_program(self) -> bytes | None:
        """The turn's seccomp filter (sandbox/confine/seccomp.py), or None: granted by the
        manifest, or no user notification on this machine (the level says which)."""
        if self.unix_sockets_granted or self.runtime.levels.get("unix_sockets") != (
            seccomp.SECCOMP_MECHANISM
        ):
            return None
        return _FILTER

    def landlock_rules(self) -> landlock.LandlockRules:
        cfg = self.runtime.config
        caps = self.capabilities
        merged: dict[str, int] = {}

        def add(rules: Iterable[tuple[str, int]]) -> None:
            for path, access in rules:
                merged[path] = merged.get(path, 0) | access

        read_roots = [p for p in cfg.system_read_paths if not p.startswith("/dev/")]
        add(_carve(read_roots, caps, int(landlock.ACCESS_READ)))
        add(_carve(caps.prefixes("read"), caps, int(landlock.ACCESS_READ)))
        add(_carve(caps.prefixes("execute"), caps, int(landlock.ACCESS_EXEC)))
        add(
            (os.path.realpath(p), int(landlock.ACCESS_EXEC))
            for p in cfg.loader_paths
            if os.path.exists(p)
        )
        add(
            (p, int(landlock.FsAccess.READ_FILE))
            for p in cfg.system_read_paths
            if p.startswith("/dev/") and os.path.exists(p)
        )
        add([(os.devnull, _DEV_NULL_ACCESS)])
        if os.path.exists("/dev/tty"):
            add([("/dev/tty", _DEV_TTY_ACCESS)])
        add(
            [
                (str(self.tmp_dir), int(landlock.ACCESS_WRITE_TREE)),
                (str(self.output_dir), int(landlock.ACCESS_WRITE_TREE)),
            ]
        )
        return landlock.LandlockRules(
            paths=tuple(sorted(merged.items())), handle_net=not self.network_granted
        )

    def ensure_confinement(self) -> dict[str, str]:
        levels = dict(self.runtime.levels)
        if self.ruleset_fd < 0 and levels["landlock"] != "unavailable":
            self.ruleset_fd, self._ruleset_notes = landlock.build_ruleset(self.landlock_rules())
        levels.update(self._ruleset_notes)
        if self.unix_sockets_granted:
            levels["unix_sockets"] = "granted"
        if self.network_granted:
            levels["network"] = "granted"
        elif self.netns_fd < 0 and levels["network"] == "netns":
            self.netns_fd = new_network_namespace()
        return levels

    def env(self, turn: int) -> tuple[tuple[str, str], ...]:
        tmp = str(self.tmp_dir)
        env = {
            "PATH": self.runtime.config.turn_path,
            "HOME": tmp,
            "TMPDIR": tmp,
            "TEMP": tmp,
            "TMP": tmp,
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
            "HUNTER_SESSION_ID": self.session_id,
            "HUNTER_TURN_NUMBER": str(turn),
            "HUNTER_OUTPUT_DIR": str(self.output_dir),
        }
        for name in self.package.manifest.env_allow:
            if name in self.env_source:
                env[name] = self.env_source[name]
        return tuple(env.items())

    def rlimits(self) -> tuple[tuple[int, int, int], ...]:
        limits = self.package.manifest.limits
        cfg = self.runtime.config
        fsize = (limits.file_size_mb or cfg.file_size_mb) << 20
        out = [
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_FSIZE, fsize, fsize),
            (resource.RLIMIT_NOFILE, cfg.nofile, cfg.nofile),
        ]
        if self.uid > 0:
            # Per-uid process count: the limit when there is no pids cgroup, otherwise a
            # backstop above it (so the cgroup, whose hits are counted, trips first).
            pids = limits.pids or cfg.pids
            if self.runtime.levels.get("pids", "").startswith("cgroup"):
                pids *= 2
            out.append((resource.RLIMIT_NPROC, pids, pids))
        return tuple(_within_own_hard_limit(res, value) for res, value, _ in out)


def _within_own_hard_limit(res: int, value: int) -> tuple[int, int, int]:
    """(res, soft, hard) no higher than the supervisor's own hard limit: raising one needs
    CAP_SYS_RESOURCE, which the service unit does not keep (a lower limit is only stricter)."""
    _, hard = resource.getrlimit(res)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    return res, value, value
