"""The sandbox runtime: what this machine enforces, the uid pool, and opening sessions.

``Runtime(root)`` probes the kernel once (Landlock ABI, network namespaces, uid drop, cgroup
controllers and ``cgroup.kill``) and records each mechanism's enforcement level; with
``enforcement="strict"`` a process turn never runs while one is missing. It hands each session
a dedicated unprivileged uid and opens (or, after a restart, resumes) sessions with both ledgers.
At start it reclaims what a previous run on the same root left behind (leftovers.py), while it
holds ``<root>/state/sandbox.lock`` (one live runtime per root reclaims; a second one does not).
docs/sandbox.md describes the threat model and what each mechanism does and does not stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import orjson
import structlog

from ledger import GroupSyncer, SessionLedgers, session_dir_for
from sandbox.capabilities import CompiledCapabilities
from sandbox.confine import landlock, seccomp
from sandbox.confine.audit import AUDIT_MECHANISM, KernelAudit
from sandbox.confine.cgroups import CgroupLayout, detect_layout
from sandbox.confine.spawn import native_available, new_network_namespace
from sandbox.errors import HelperError, SandboxUnavailableError, SessionNotFoundError
from sandbox.packages import load_package
from sandbox.runtime.area import SessionArea, implicit_forbidden
from sandbox.runtime.config import DEFAULT_LOADER_PATHS, DEFAULT_SYSTEM_READ_PATHS, RuntimeConfig
from sandbox.runtime.leftovers import Leftovers, reclaim_leftovers
from sandbox.runtime.session import Session
from sandbox.session_ids import is_session_id, new_session_id

if TYPE_CHECKING:
    from sandbox.packages import Package
    from sandbox.runtime.confined_area import ConfinedArea, HelperLink

__all__ = [
    "DEFAULT_LOADER_PATHS",
    "DEFAULT_SYSTEM_READ_PATHS",
    "Runtime",
    "RuntimeConfig",
]

_log = structlog.get_logger("sandbox.runtime.runtime")

_PR_SET_CHILD_SUBREAPER: Final = 36


def cgroup_prefix_for(root: Path) -> str:
    """The prefix of this root's cgroup leaf names: ``root-<16 hex of its real path>.``."""
    tag = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:16]
    return f"root-{tag}."


def _lock_root(root: Path) -> int:
    """Take ``<root>/state/sandbox.lock`` (flock, not blocking): its fd, or -1 when another
    runtime (in this process or another) holds it. Released when the fd is closed."""
    state = root / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(state / "sandbox.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    except BaseException:
        os.close(fd)
        raise
    return fd


def _searchable_by_others(path: Path) -> Path | None:
    """The first ancestor of *path* (inclusive) that others cannot traverse, or None."""
    for p in (path, *path.parents):
        try:
            mode = p.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & stat.S_IXOTH:
            return p
    return None


def _become_subreaper() -> bool:
    """Make this process the child subreaper (PR_SET_CHILD_SUBREAPER): a turn's orphans are
    re-parented here, not to PID 1 (with a PID namespace per turn they never leave it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


class Runtime:
    """Packages, sessions and sandboxed turns under one root directory."""

    def __init__(
        self,
        root: Path,
        *,
        config: RuntimeConfig | None = None,
        syncer: GroupSyncer | None = None,
        forbidden_sockets: Sequence[Path] = (),
        helper: HelperLink | None = None,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.config = config or RuntimeConfig()
        self._syncer = syncer
        self.forbidden_sockets = tuple(Path(p) for p in forbidden_sockets)
        #: the root sandbox helper that confines this runtime's turns (None: this process)
        self.helper = helper
        #: whether the helper closed what a previous run of this daemon left open
        self.helper_reset = False
        self._uids_in_use: set[int] = set()
        self._layout: CgroupLayout | None = None
        self._stdin_fd = -1
        #: the prefix of every cgroup leaf name of this root (see `leftovers`)
        self.cgroup_prefix = cgroup_prefix_for(self.root)
        #: where Landlock's denials are read from (None: they are blocked but not recorded)
        self.audit: KernelAudit | None = None
        #: `landlock_restrict_self` flags of every turn (audit logging when `audit` is set)
        self.landlock_flags = 0
        #: what the start reclaimed from a previous run (None: another runtime is live here,
        #: or the helper reclaims its own)
        self.leftovers: Leftovers | None = None
        if helper is not None:
            self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
            self.levels, self.missing = self._ask_helper()
            lock_fd = _lock_root(self.root)
            self._unlock = weakref.finalize(self, os.close, lock_fd) if lock_fd >= 0 else None
            _log.info(
                "sandbox_enforcement",
                root=str(self.root),
                helper_socket=str(helper.path),
                **self.levels,
            )
            return
        for sub in ("", "tmp", "output"):
            d = self.root / sub
            d.mkdir(mode=0o711, parents=True, exist_ok=True)
            if sub and d.stat().st_uid == os.geteuid():
                d.chmod(0o711)  # others may traverse to their session dir, never list
        self.levels, self.missing = self._probe()
        self._open_audit()
        _log.info("sandbox_enforcement", root=str(self.root), **self.levels)
        lock_fd = _lock_root(self.root)
        # Closed by `close`, or when the runtime is collected (a daemon never closes it).
        self._unlock = weakref.finalize(self, os.close, lock_fd) if lock_fd >= 0 else None
        if self._unlock is None:
            _log.warning(
                "sandbox_leftovers_not_reclaimed",
                root=str(self.root),
                reason="another runtime holds the root's sandbox.lock",
            )
        else:
            self.leftovers = self._reclaim_leftovers()

    def _ask_helper(self) -> tuple[dict[str, str], dict[str, str]]:
        """The helper's enforcement levels; ``helper`` missing while it cannot be reached."""
        assert self.helper is not None
        try:
            welcome = self.helper.hello()
            if not self.helper_reset:  # once per runtime: the previous run's areas go
                self.helper.reset(self.root)
                self.helper_reset = True
        except (OSError, HelperError) as exc:
            _log.error("sandbox_helper_unreachable", helper=str(self.helper.path), error=str(exc))
            return {"helper": "unreachable"}, {"helper": str(exc)}
        levels = dict(welcome.levels)
        levels["helper"] = "separate"
        return levels, dict(welcome.missing)

    def new_area(
        self, session_id: str, package: Package, capabilities: CompiledCapabilities, workspace: Path
    ) -> ConfinedArea:
        """A session's confined area: in this process, or kept by the sandbox helper."""
        if self.helper is not None and "helper" in self.missing:
            # unreachable so far: ask again here (blocking; sessions open in worker threads)
            self.levels, self.missing = self._ask_helper()
            if "helper" not in self.missing:
                _log.info("sandbox_helper_reached", **self.levels)
        if self.helper is not None:
            return self.helper.area(
                session_id=session_id,
                package=package,
                workspace=workspace,
                forbidden=implicit_forbidden(self),
                owner=self.root,
            )
        return SessionArea(self, session_id=session_id, package=package, capabilities=capabilities)

    def _open_audit(self) -> None:
        abi = landlock.abi_version()
        found = (
            KernelAudit.open(self.config.kernel_audit)
            if abi >= landlock.AUDIT_ABI
            else f"Landlock ABI {abi} writes no audit records (needs ABI 7, Linux 6.15)"
        )
        if isinstance(found, str):
            self.levels["fs_denials"] = "unrecorded"
            if self.config.kernel_audit != "off":
                _log.warning(
                    "kernel_denials_unrecorded",
                    reason=found,
                    consequence="Landlock still blocks reads, writes and executions outside "
                    "a turn's grants; they are not on the evidence record",
                )
            return
        self.audit = found
        self.landlock_flags = landlock.log_flags(abi)
        self.levels["fs_denials"] = AUDIT_MECHANISM

    # -- leftovers of a previous run -------------------------------------------------------

    def is_sandbox_uid(self, uid: int) -> bool:
        """Whether *uid* is one this runtime hands to sessions (never 0 or its own)."""
        if uid <= 0 or uid == os.geteuid():
            return False
        if self.config.run_as_uid is not None:
            return uid == self.config.run_as_uid
        first, last = self.config.uid_range
        return first <= uid <= last

    def _reclaim_leftovers(self) -> Leftovers:
        """Kill and remove what a previous run on this root left (leftovers.py); log it."""
        found = reclaim_leftovers(
            self.root,
            layout=self.layout,
            cgroup_prefix=self.cgroup_prefix,
            sandbox_uid=self.is_sandbox_uid,
        )
        fields = found.to_log()
        if found.cgroups_busy or found.errors:
            _log.warning("sandbox_leftovers_reclaimed", root=str(self.root), **fields)
        elif found.found:
            _log.info("sandbox_leftovers_reclaimed", root=str(self.root), **fields)
        else:
            _log.debug("sandbox_leftovers_reclaimed", root=str(self.root), **fields)
        return found

    # -- capability probing ----------------------------------------------------------------

    def _probe(self) -> tuple[dict[str, str], dict[str, str]]:
        levels: dict[str, str] = {}
        missing: dict[str, str] = {}
        is_root = os.geteuid() == 0
        levels["launcher"] = (
            "native" if self.config.launcher != "python" and native_available() else "python"
        )
        abi = landlock.abi_version()
        levels["landlock"] = f"abi-{abi}" if abi else "unavailable"
        if not abi:
            missing["landlock"] = "kernel has no Landlock"
        levels["landlock_scope"] = "enforced" if abi >= 6 else "unavailable"
        if abi < 6:
            missing["landlock_scope"] = f"Landlock ABI {abi} < 6 (signals, abstract sockets)"
        if is_root:
            # run_as_uid=0 is refused by RuntimeConfig: turns never run as root.
            levels["uid_drop"] = "per-session" if self.config.run_as_uid is None else "fixed"
            blocker = _searchable_by_others(self.root)
            if blocker is not None:
                missing["root_traversal"] = (
                    f"{blocker} is not searchable by other users; the turn's uid cannot reach "
                    f"{self.root} (chmod o+x or choose another root)"
                )
        else:
            levels["uid_drop"] = "unavailable"
            missing["uid_drop"] = "the runtime is not root, turns run as its own uid"
        try:
            fd = new_network_namespace()
        except OSError as exc:
            levels["network"] = "landlock-tcp" if abi >= 4 else "unavailable"
            missing["netns"] = f"cannot create a network namespace: {exc.strerror}"
        else:
            os.close(fd)
            levels["network"] = "netns"
        self._layout = detect_layout()
        levels["memory"] = self._layout.controller_level("memory")
        levels["pids"] = self._layout.controller_level("pids")
        levels["tree_kill"] = self._layout.kill_level
        if levels["memory"] == "unavailable":
            missing["cgroup_memory"] = "no writable memory cgroup controller"
        if levels["pids"] == "unavailable":
            if levels["uid_drop"] != "unavailable":
                levels["pids"] = "rlimit-nproc"
            else:
                missing["cgroup_pids"] = "no pids controller and no uid drop for RLIMIT_NPROC"
        if levels["tree_kill"] != "cgroup.kill":
            missing["cgroup_kill"] = "no cgroup v2 cgroup.kill (setsid escapes are possible)"
        levels["file_size"] = "rlimit"
        levels["disk"] = (
            "tmpfs" if is_root and self.config.session_disk == "tmpfs" else "post-run-check"
        )
        no_notif = seccomp.user_notif_available()
        levels["unix_sockets"] = "unavailable" if no_notif else seccomp.SECCOMP_MECHANISM
        if no_notif:
            missing["seccomp"] = f"{no_notif}: pathname Unix sockets outside are reachable"
        # A PID namespace per turn: clone(CLONE_NEWPID) needs the native launcher and root.
        levels["pid_namespace"] = (
            "per-turn" if is_root and levels["launcher"] == "native" else "unavailable"
        )
        # Only with a uid drop: orphans are then recognisable (a sandbox uid) and reaped.
        levels["subreaper"] = "yes" if is_root and _become_subreaper() else "unavailable"
        levels["enforcement"] = self.config.enforcement
        for sock in self.forbidden_sockets:
            problem = self._socket_problem(sock)
            if problem:
                missing[f"socket:{sock}"] = problem
        return levels, missing

    @staticmethod
    def _socket_problem(sock: Path) -> str:
        try:
            st = sock.stat()
        except FileNotFoundError:
            return ""
        if st.st_uid != os.geteuid() or st.st_mode & 0o002:
            return "socket is writable by other users (needs owner = supervisor, mode 0660)"
        return ""

    def require_enforcement(self) -> None:
        """Raise ``SandboxUnavailableError`` in strict mode when a mechanism is missing (and
        whatever the mode while the sandbox helper cannot be reached)."""
        if "helper" in self.missing:  # asked again when a session opens (a worker thread)
            raise SandboxUnavailableError(mechanisms={"helper": self.missing["helper"]})
        if self.config.enforcement == "strict" and self.missing:
            raise SandboxUnavailableError(mechanisms=self.missing)
        if "root_traversal" in self.missing:
            raise SandboxUnavailableError(
                mechanisms={"root_traversal": self.missing["root_traversal"]}
            )

    @property
    def layout(self) -> CgroupLayout:
        """The detected cgroup layout."""
        assert self._layout is not None
        return self._layout

    def stdin_fd(self) -> int:
        """A shared read-only ``/dev/null`` fd used as every turn's stdin."""
        if self._stdin_fd < 0:
            self._stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return self._stdin_fd

    # -- sessions -------------------------------------------------------------------------

    def allocate_uid(self, session_id: str) -> tuple[int, int]:
        """A uid (and gid) for a session: dedicated when root, (-1, -1) when not root."""
        if os.geteuid() != 0:
            return -1, -1
        if self.config.run_as_uid is not None:
            return self.config.run_as_uid, self.config.run_as_uid
        first, last = self.config.uid_range
        size = last - first + 1
        start = int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") % size
        for i in range(size):
            uid = first + (start + i) % size
            if uid not in self._uids_in_use:
                self._uids_in_use.add(uid)
                return uid, uid
        raise SandboxUnavailableError(mechanisms={"uid_drop": "uid range exhausted"})

    def release_uid(self, uid: int) -> None:
        """Return a session's uid to the pool."""
        self._uids_in_use.discard(uid)

    def open_session(
        self,
        package_id: str,
        *,
        tier: str = "default",
        work_order_id: str | None = None,
        workspace: Path | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Load the package, make a session id, create both ledgers and the sandbox dirs."""
        package = load_package(self.root, package_id)
        sid = session_id or new_session_id()
        if not is_session_id(sid):
            raise ValueError(f"not a session id: {sid!r}")
        ws = Path(workspace) if workspace is not None else self.root / "workspace" / sid
        ledgers = SessionLedgers.create(
            root=self.root,
            tier=tier,
            session_id=sid,
            syncer=self._syncer,
            work_order_id=work_order_id,
            opened_extra={
                "package_id": package_id,
                "workspace": str(ws),
                "enforcement": dict(self.levels),
            },
        )
        return Session(self, package, ledgers, workspace=ws, work_order_id=work_order_id)

    def resume_session(
        self,
        session_id: str,
        *,
        tier: str = "default",
        package_id: str | None = None,
        workspace: Path | None = None,
        work_order_id: str | None = None,
    ) -> Session:
        """Reopen an existing session (after a restart); its package comes from the ledger."""
        if not is_session_id(session_id):
            raise SessionNotFoundError(session_id=session_id, tier=tier)
        exec_path = session_dir_for(self.root, tier, session_id) / "ledger" / "exec.jsonl"
        if not exec_path.is_file():
            raise SessionNotFoundError(session_id=session_id, tier=tier)
        opened: dict[str, object] = {}
        last_turn = 0
        with exec_path.open("rb") as handle:
            for line in handle:
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(entry, dict):
                    continue
                if entry.get("kind") == "session_opened" and not opened:
                    opened = entry
                turn = entry.get("turn_number")
                if isinstance(turn, int):
                    last_turn = max(last_turn, turn)
        pkg = package_id or str(opened.get("package_id", ""))
        package = load_package(self.root, pkg)
        ws_text = opened.get("workspace")
        ws = workspace or (
            Path(ws_text) if isinstance(ws_text, str) else self.root / "workspace" / session_id
        )
        wo = work_order_id
        if wo is None and isinstance(opened.get("work_order_id"), str):
            wo = str(opened["work_order_id"])
        ledgers = SessionLedgers.open(
            root=self.root,
            tier=tier,
            session_id=session_id,
            syncer=self._syncer,
            work_order_id=wo,
        )
        session = Session(self, package, ledgers, workspace=ws, work_order_id=wo)
        session.next_turn_number = last_turn + 1
        return session

    def close(self) -> None:
        """Release shared fds and the root's lock (sessions are closed by their owners)."""
        if self._stdin_fd >= 0:
            os.close(self._stdin_fd)
            self._stdin_fd = -1
        if self.audit is not None:
            self.audit.close()
            self.audit = None
        if self._unlock is not None:
            with contextlib.suppress(OSError):
                self._unlock()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
