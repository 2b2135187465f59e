"""The sandbox runtime: sessions and sandboxed process turns (seed 004).

``Runtime(root)`` loads packages, opens sessions (both ledgers + ``tmp/<sid>``,
``output/<sid>``), and runs process turns: capability checks before the run, a confined
launch (unprivileged uid, fresh environment, Landlock, empty network namespace, cgroup
limits, rlimits), a deadline with whole-tree kill, enumeration of realized writes, the
write-surface comparison, promotion into the workspace, attempts run by THE attempt loop
(``sandbox.policy.attempt_loop.run_attempts``), and both ledger entries for every turn.
docs/sandbox.md describes the threat model and what each mechanism does and does not stop.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import anyio
import orjson
import structlog

from ledger import GroupSyncer, LedgerEntry, SessionLedgers
from sandbox.capabilities import (
    DEFAULT_TURN_PATH,
    CompiledCapabilities,
    compile_capabilities,
    has_glob,
    resolve_command,
)
from sandbox.confine import landlock
from sandbox.confine.cgroups import CgroupLayout, TurnCgroup, detect_layout
from sandbox.confine.spawn import (
    SpawnRequest,
    close_quietly,
    native_available,
    new_network_namespace,
    reap,
    spawn,
)
from sandbox.enumerate import RealizedWrite, SurfaceProblem, WriteSurface, enumerate_writes
from sandbox.errors import (
    CapabilityViolation,
    DeclarationError,
    SandboxUnavailableError,
    SessionNotFoundError,
    SpawnError,
)
from sandbox.packages import Package, load_package
from sandbox.policy.attempt_loop import AttemptReport, run_attempts
from sandbox.policy.attempt_record import AttemptRecord as LoopRecord
from sandbox.policy.attempts import (
    AgentPhase,
    AttemptDecision,
    AttemptOutcome,
    OutcomeKind,
    RetryOptions,
    Verdict,
)
from sandbox.policy.declarations import DeclarationProblem, DeclaredOutput
from sandbox.policy.declarations import parse_declared_outputs as _parse_declared_outputs
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.retry_protocol import EntropyDetector, ToolCall
from sandbox.promote import PromotedOutput, PromotionError, promote_outputs
from sandbox.prompt_header import PromptHeader, build_prompt_header
from sandbox.session_ids import is_session_id, new_session_id

__all__ = [
    "DEFAULT_LOADER_PATHS",
    "DEFAULT_SYSTEM_READ_PATHS",
    "AttemptRecord",
    "DeclaredOutput",
    "Runtime",
    "RuntimeConfig",
    "Session",
    "TurnResult",
    "TurnStatus",
]

_log = structlog.get_logger("sandbox.runtime.session")

TurnStatus = Literal[
    "succeeded",
    "failed",
    "timeout",
    "violation",
    "exhausted",
    "escalated",
    "rejected",
    "terminated",
]

#: What every dynamically linked program needs to start, plus a few read-only basics.
DEFAULT_SYSTEM_READ_PATHS: Final = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
)
#: ELF interpreters: execve needs Landlock EXECUTE on the dynamic loader as well.
DEFAULT_LOADER_PATHS: Final = (
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-x86-64.so.2",
    "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
)
_DEV_NULL_ACCESS: Final = int(
    landlock.FsAccess.READ_FILE | landlock.FsAccess.WRITE_FILE | landlock.FsAccess.TRUNCATE
)
_MAX_CARVE_RULES: Final = 4096
_SIGXFSZ: Final = int(signal.SIGXFSZ)

# Reason codes of the sandbox edge (the policy core's codes are in sandbox/policy/reason_codes.py).
DECLARATION_INVALID: Final = "DECLARATION_INVALID"
CAPABILITY_REJECTED: Final = "CAPABILITY_REJECTED"
SANDBOX_UNAVAILABLE: Final = "SANDBOX_UNAVAILABLE"
SPAWN_FAILED: Final = "SPAWN_FAILED"
PROMOTION_FAILED: Final = "PROMOTION_FAILED"
TURN_CANCELLED: Final = "TURN_CANCELLED"
TURN_ERROR: Final = "TURN_ERROR"


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """How turns are confined; every field has a safe default.

    ``enforcement``: ``"strict"`` refuses to run a process turn unless every mechanism is
    available (Landlock, network isolation, uid drop, cgroup memory/pids limits and tree
    kill); ``"best-effort"`` runs with what exists. Either way the level of each mechanism
    is logged and written to the evidence entry.
    ``uid_range`` (first, last inclusive): a dedicated uid per session when the runtime is
    root; ``run_as_uid`` pins one uid instead. Limits apply when the manifest sets none.
    """

    enforcement: Literal["strict", "best-effort"] = "strict"
    uid_range: tuple[int, int] = (200_000, 265_535)
    run_as_uid: int | None = None
    memory_mb: int = 512
    pids: int = 256
    timeout_s: float = 600.0
    output_bytes: int = 1 << 20
    file_size_mb: int = 64
    disk_mb: int = 1024
    nofile: int = 1024
    kill_grace_s: float = 2.0
    launcher: Literal["auto", "native", "python"] = "auto"
    system_read_paths: tuple[str, ...] = DEFAULT_SYSTEM_READ_PATHS
    loader_paths: tuple[str, ...] = DEFAULT_LOADER_PATHS
    denied_paths: tuple[str, ...] = ()
    turn_path: str = DEFAULT_TURN_PATH

    def __post_init__(self) -> None:
        if self.run_as_uid is not None and self.run_as_uid <= 0:
            raise ValueError(
                "run_as_uid must be an unprivileged uid (> 0): turns never run as root"
            )
        first, last = self.uid_range
        if not 0 < first <= last:
            raise ValueError(f"uid_range must be 0 < first <= last, got {self.uid_range}")


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of a turn: how the process ended and what the policy decided."""

    attempt_number: int
    exit_code: int | None
    signal: int | None
    timed_out: bool
    resource_exhausted: bool
    security_violation: bool
    outcome: str
    fault_type: str | None
    verdict: str
    reason_code: str
    reason: str
    delay_ms: int
    duration_ms: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    leftover_processes: int
    resource_events: Mapping[str, int]
    realized_writes: tuple[RealizedWrite, ...]
    problems: tuple[SurfaceProblem, ...]
    launcher: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (stdout/stderr as text; ledgers get hashes only)."""
        return {
            "attempt_number": self.attempt_number,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "resource_exhausted": self.resource_exhausted,
            "security_violation": self.security_violation,
            "outcome": self.outcome,
            "fault_type": self.fault_type,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "delay_ms": self.delay_ms,
            "duration_ms": self.duration_ms,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "leftover_processes": self.leftover_processes,
            "resource_events": dict(self.resource_events),
            "realized_writes": [w.to_dict() for w in self.realized_writes],
            "problems": [p.to_dict() for p in self.problems],
            "launcher": self.launcher,
        }

    def ledger_summary(self) -> dict[str, object]:
        """The attempt as it goes into the exec ledger (no output text, only hashes)."""
        data = self.to_dict()
        for key in ("stdout", "stderr"):
            text = data.pop(key)
            assert isinstance(text, str)
            data[f"{key}_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        data.pop("realized_writes")
        return data


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The result of one process turn (every field is also in ``to_dict``)."""

    session_id: str
    turn_number: int
    status: TurnStatus
    exit_code: int | None
    fault_type: str | None
    verdict: str
    reason_code: str
    reason: str
    attempts: tuple[AttemptRecord, ...]
    realized_writes: tuple[RealizedWrite, ...]
    violations: tuple[CapabilityViolation, ...]
    promoted_outputs: tuple[PromotedOutput, ...]
    duration_ms: int
    enforcement: Mapping[str, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``hunter turn --json``)."""
        return {
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "status": self.status,
            "exit_code": self.exit_code,
            "fault_type": self.fault_type,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "attempts": [a.to_dict() for a in self.attempts],
            "realized_writes": [w.to_dict() for w in self.realized_writes],
            "violations": [v.to_dict() for v in self.violations],
            "promoted_outputs": [p.to_dict() for p in self.promoted_outputs],
            "duration_ms": self.duration_ms,
            "enforcement": dict(self.enforcement),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }

    def raise_for_violation(self) -> None:
        """Raise the first ``CapabilityViolation`` of the turn, if there is one (FR-RT-016)."""
        if self.violations:
            raise self.violations[0]


@dataclass(slots=True)
class _TurnProgress:
    """What a running turn has done so far, so a turn cut short still records it."""

    request: dict[str, object]
    attempts: list[AttemptRecord] = field(default_factory=list)
    violations: list[CapabilityViolation] = field(default_factory=list)
    recorded: list[dict[str, object]] = field(default_factory=list)
    promoted: list[PromotedOutput] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _ConfinedRun:
    """What one confined run produced besides its outcome (the loop's report payload)."""

    record: AttemptRecord
    outcome: AttemptOutcome
    surface: WriteSurface


class _ProcessHooks:
    """THE attempt loop's hooks for a process turn: a retried attempt is recorded on the turn's
    progress (so a turn cut short during its backoff still records it) and logged."""

    __slots__ = ("_finished", "_session_id", "_turn", "last")

    def __init__(
        self,
        session_id: str,
        turn: int,
        finished: Callable[[_ConfinedRun, AttemptDecision], None],
    ) -> None:
        self._session_id = session_id
        self._turn = turn
        self._finished = finished
        self.last: _ConfinedRun | None = None

    async def attempt_started(self, attempt: LoopRecord) -> None:
        del attempt

    async def retry_scheduled(
        self, attempt: LoopRecord, decision: AttemptDecision, next_attempt_us: int
    ) -> None:
        del next_attempt_us
        assert self.last is not None
        self._finished(self.last, decision)
        _log.info(
            "retry_scheduled",
            session_id=self._session_id,
            turn_number=self._turn,
            attempt=attempt.attempt,
            delay_ms=decision.delay_ms,
        )


def _now_us() -> int:
    return time.time_ns() // 1000


def _digest(data: object) -> str:
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _ms_since(start_ns: int) -> int:
    return (time.monotonic_ns() - start_ns) // 1_000_000


def parse_declared_outputs(declared: object) -> tuple[DeclaredOutput, ...]:
    """Validate ``declared_outputs`` (FR-RT-013) with the one parser of
    ``sandbox.policy.declarations``; raise ``DeclarationError`` naming the field."""
    try:
        return _parse_declared_outputs(declared)
    except DeclarationProblem as exc:
        raise DeclarationError(field=exc.field, problem=exc.problem) from None


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


class Runtime:
    """Packages, sessions and sandboxed turns under one root directory."""

    def __init__(
        self,
        root: Path,
        *,
        config: RuntimeConfig | None = None,
        syncer: GroupSyncer | None = None,
        forbidden_sockets: Sequence[Path] = (),
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.config = config or RuntimeConfig()
        self._syncer = syncer
        self.forbidden_sockets = tuple(Path(p) for p in forbidden_sockets)
        self._uids_in_use: set[int] = set()
        self._layout: CgroupLayout | None = None
        self._stdin_fd = -1
        for sub in ("", "tmp", "output"):
            d = self.root / sub
            d.mkdir(mode=0o711, parents=True, exist_ok=True)
            if sub and d.stat().st_uid == os.geteuid():
                d.chmod(0o711)  # others may traverse to their session dir, never list
        self.levels, self.missing = self._probe()
        _log.info("sandbox_enforcement", root=str(self.root), **self.levels)

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
        """Raise ``SandboxUnavailableError`` in strict mode when a mechanism is missing."""
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

    def _allocate_uid(self, session_id: str) -> tuple[int, int]:
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
        from ledger import session_dir_for

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
        """Release shared fds (sessions are closed by their owners)."""
        if self._stdin_fd >= 0:
            os.close(self._stdin_fd)
            self._stdin_fd = -1

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """One session: its package, ledgers, sandbox dirs and the turns run in it.

    The session owns *ledgers* from construction on: ``close`` closes them, and so does a
    constructor that fails (which also returns the session's uid to the pool).
    """

    def __init__(
        self,
        runtime: Runtime,
        package: Package,
        ledgers: SessionLedgers,
        *,
        workspace: Path,
        work_order_id: str | None,
    ) -> None:
        self.runtime = runtime
        self.package = package
        self.ledgers = ledgers
        self.session_id = ledgers.session_id
        self.tier = ledgers.tier
        self.work_order_id = work_order_id
        self.workspace = Path(os.path.abspath(workspace))
        self.next_turn_number = 1
        self.tmp_dir = runtime.root / "tmp" / self.session_id
        self.output_dir = runtime.root / "output" / self.session_id
        self.uid = self.gid = -1
        self._lock = anyio.Lock()
        self._netns_fd = -1
        self._ruleset_fd = -1
        self._ruleset_notes: dict[str, str] = {}
        self._area_inodes: dict[str, tuple[int, int]] = {}
        self._cgroup: TurnCgroup | None = None
        self._turn_recorded = False
        self._closed = False
        cfg = runtime.config
        root = runtime.root
        implicit_forbidden = [
            f"{root}/{sub}/**" for sub in ("planes", "state", "installed", "run", "tmp", "output")
        ]
        implicit_forbidden += [str(p) for p in runtime.forbidden_sockets]
        implicit_forbidden += list(cfg.denied_paths)
        caps = package.capabilities
        try:
            self.capabilities = compile_capabilities(
                read=caps.read,
                write=caps.write,
                execute=caps.execute,
                forbidden=(*caps.forbidden, *implicit_forbidden),
                workspace=self.workspace,
                search_path=cfg.turn_path,
            )
            self.uid, self.gid = runtime._allocate_uid(self.session_id)
            self._prepare_dirs()
        except BaseException:
            self.close()  # the session owns its ledgers and uid from the start
            raise

    # -- sandbox dirs ---------------------------------------------------------------------

    def _make_area(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if self.uid >= 0:
            os.chown(path, self.uid, self.gid)
        os.chmod(path, 0o700)

    def _prepare_dirs(self) -> None:
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
            _empty_directory(area)
            if self.uid >= 0 and (st.st_uid, st.st_gid) != (self.uid, self.gid):
                os.chown(area, self.uid, self.gid)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(area, 0o700)
            if (st.st_ino, st.st_dev) != self._area_inodes.get(str(area), (st.st_ino, st.st_dev)):
                self._invalidate_ruleset()
            self._area_inodes[str(area)] = (st.st_ino, st.st_dev)

    def _turn_cgroup(self) -> TurnCgroup:
        """The session's cgroup leaf, created on first use and reused by its attempts.

        Only one attempt of a session runs at a time and each ends with the leaf empty, so
        reuse is safe; limit counters are read as deltas around each attempt.
        """
        if self._cgroup is None:
            limits = self.package.manifest.limits
            cfg = self.runtime.config
            self._cgroup = TurnCgroup.create(
                self.runtime.layout,
                f"{self.session_id}-{os.urandom(3).hex()}",
                memory_bytes=(limits.memory_mb or cfg.memory_mb) << 20,
                pids=limits.pids or cfg.pids,
            )
        return self._cgroup

    def _drop_cgroup(self) -> None:
        """Stop using the session's cgroup (kill what is left, remove it if empty)."""
        cg, self._cgroup = self._cgroup, None
        if cg is not None:
            cg.kill_all()
            cg.remove()

    def _invalidate_ruleset(self) -> None:
        if self._ruleset_fd >= 0:
            os.close(self._ruleset_fd)
            self._ruleset_fd = -1
        self._area_inodes.clear()

    # -- confinement (cached per session) ------------------------------------------------

    @property
    def network_granted(self) -> bool:
        """Whether the manifest grants network access."""
        return self.package.capabilities.network

    def _landlock_rules(self) -> landlock.LandlockRules:
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
        add(
            [
                (str(self.tmp_dir), int(landlock.ACCESS_WRITE_TREE)),
                (str(self.output_dir), int(landlock.ACCESS_WRITE_TREE)),
            ]
        )
        return landlock.LandlockRules(
            paths=tuple(sorted(merged.items())), handle_net=not self.network_granted
        )

    def _ensure_confinement(self) -> dict[str, str]:
        levels = dict(self.runtime.levels)
        if self._ruleset_fd < 0 and levels["landlock"] != "unavailable":
            self._ruleset_fd, self._ruleset_notes = landlock.build_ruleset(self._landlock_rules())
        levels.update(self._ruleset_notes)
        if self.network_granted:
            levels["network"] = "granted"
        elif self._netns_fd < 0 and levels["network"] == "netns":
            self._netns_fd = new_network_namespace()
        return levels

    # -- checks before a turn -----------------------------------------------------------------

    def _violation(
        self, turn: int, operation: str, target: str, capability: str, detail: str
    ) -> CapabilityViolation:
        return CapabilityViolation(
            operation=operation,
            target=target,
            capability=capability,
            session_id=self.session_id,
            turn_number=turn,
            detail=detail,
        )

    def _check_request(
        self, argv: Sequence[str], declared_outputs: object, turn: int
    ) -> tuple[str, tuple[DeclaredOutput, ...]]:
        """Validate a request; return the resolved executable and the declarations.

        Raises ``DeclarationError`` (shape) or ``CapabilityViolation`` (not allowed).
        """
        items: Sequence[object] = argv
        if not items or not all(isinstance(a, str) and "\0" not in a for a in items):
            raise DeclarationError(field="argv", problem="a non-empty list of strings")
        declared = parse_declared_outputs(declared_outputs)
        exe = resolve_command(
            argv[0], cwd=self.output_dir, search_path=self.runtime.config.turn_path
        )
        if exe is None:
            raise self._violation(
                turn,
                "execute",
                argv[0],
                "capabilities.execute",
                "command not found or not executable",
            )
        check = self.capabilities.check_execute(exe)
        if not check.allowed:
            detail = f"resolved to {exe}"
            if check.matched:
                detail += f"; matches forbidden pattern {check.matched!r}"
            raise self._violation(turn, "execute", argv[0], check.capability, detail)
        for out in declared:
            wcheck = self.capabilities.check_write(self.workspace / out.path)
            if not wcheck.allowed:
                detail = f"destination {wcheck.path}"
                if wcheck.matched:
                    detail += f"; matches forbidden pattern {wcheck.matched!r}"
                raise self._violation(turn, "declare", out.path, wcheck.capability, detail)
        return exe, declared

    def check_turn_request(
        self, argv: Sequence[str], declared_outputs: object, *, turn_number: int | None = None
    ) -> None:
        """Check a request for the daemon's intake; a violation is recorded, then raised."""
        turn = turn_number or self.next_turn_number
        try:
            self._check_request(argv, declared_outputs, turn)
        except CapabilityViolation as exc:
            self.ledgers.record_violation(
                turn_number=turn,
                operation=exc.operation,
                target=exc.target,
                capability=exc.capability,
                detail=exc.detail,
            )
            raise

    def prompt_header(
        self,
        *,
        turn_number: int,
        declared_inputs: Sequence[str] = (),
        declared_outputs: Sequence[Mapping[str, str]] = (),
    ) -> PromptHeader:
        """The prompt header of a turn (inputs hashed relative to the workspace)."""
        return build_prompt_header(
            session_id=self.session_id,
            turn_number=turn_number,
            declared_inputs=declared_inputs,
            declared_outputs=declared_outputs,
            base=self.workspace,
            work_order_id=self.work_order_id,
        )

    # -- the turn ------------------------------------------------------------------------------

    async def run_process_turn(
        self,
        argv: Sequence[str],
        *,
        declared_outputs: object,
        declared_inputs: Sequence[str] = (),
        phase: AgentPhase | None = None,
        timeout_ms: int | None = None,
        turn_number: int | None = None,
        options: RetryOptions | None = None,
        delay: Callable[[float], Awaitable[None]] = anyio.sleep,
        entropy_detector: EntropyDetector | None = None,
    ) -> TurnResult:
        """Run one process turn (all attempts); both ledgers get their entries in every case.

        A request that is malformed or not allowed is *rejected* before it runs (status
        ``rejected``; ``violations`` holds the recorded ``CapabilityViolation``).
        ``SandboxUnavailableError`` is raised (after recording the rejected turn) when the
        strict enforcement level cannot be met.
        """
        async with self._lock:
            turn = turn_number if turn_number is not None else self.next_turn_number
            self.next_turn_number = max(self.next_turn_number, turn + 1)
            self._turn_recorded = False
            start_ns = time.monotonic_ns()
            progress = _TurnProgress(request={"argv": list(argv)})
            try:
                return await self._run(
                    progress,
                    argv=list(argv),
                    declared_outputs=declared_outputs,
                    declared_inputs=tuple(declared_inputs),
                    phase=phase,
                    timeout_ms=timeout_ms,
                    turn=turn,
                    options=options or RetryOptions(),
                    delay=delay,
                    entropy_detector=entropy_detector,
                )
            except BaseException as exc:
                if not self._turn_recorded:
                    with anyio.CancelScope(shield=True):
                        await self._record_aborted(turn, progress, exc, start_ns)
                raise

    async def _record_aborted(
        self, turn: int, progress: _TurnProgress, exc: BaseException, start_ns: int
    ) -> None:
        """Both ledger entries for a turn cut short by cancellation or an internal error.

        The attempt's process tree is already dead (the attempt's cleanup runs shielded).
        The attempts, violations and promotions done before the abort are recorded with it.
        A failure to record is logged; it never replaces the original exception.
        """
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        result = TurnResult(
            session_id=self.session_id,
            turn_number=turn,
            status="terminated",
            exit_code=None,
            fault_type=None,
            verdict=Verdict.TERMINATE.value,
            reason_code=TURN_CANCELLED if cancelled else TURN_ERROR,
            reason="the turn was cancelled" if cancelled else f"{type(exc).__name__}: {exc}",
            attempts=tuple(progress.attempts),
            realized_writes=(),
            violations=tuple(progress.violations),
            promoted_outputs=tuple(progress.promoted),
            duration_ms=_ms_since(start_ns),
            enforcement=dict(self.runtime.levels),
        )
        try:
            await self._record(
                turn, progress.request, result, progress.recorded, declared=(), header=None
            )
        except Exception as record_exc:  # never mask the original exception
            _log.error(
                "turn_record_failed",
                session_id=self.session_id,
                turn_number=turn,
                error=repr(record_exc),
            )

    async def _reject(
        self,
        turn: int,
        request: dict[str, object],
        start_ns: int,
        *,
        reason_code: str,
        reason: str,
        violation: CapabilityViolation | None,
        levels: Mapping[str, str],
    ) -> TurnResult:
        violations: tuple[CapabilityViolation, ...] = ()
        recorded: list[dict[str, object]] = []
        if violation is not None:
            recorded = await self._record_violation(turn, violation)
            violations = (violation,)
        result = TurnResult(
            session_id=self.session_id,
            turn_number=turn,
            status="rejected",
            exit_code=None,
            fault_type=ExecutionFaultType.SECURITY_VIOLATION.value if violation else None,
            verdict=Verdict.TERMINATE.value,
            reason_code=reason_code,
            reason=reason,
            attempts=(),
            realized_writes=(),
            violations=violations,
            promoted_outputs=(),
            duration_ms=_ms_since(start_ns),
            enforcement=dict(levels),
        )
        await self._record(turn, request, result, recorded, declared=(), header=None)
        _log.warning(
            "turn_rejected",
            session_id=self.session_id,
            turn_number=turn,
            reason_code=reason_code,
            reason=reason,
        )
        return result

    async def _record_violation(
        self, turn: int, violation: CapabilityViolation
    ) -> list[dict[str, object]]:
        """Write a violation's evidence entry now; return it as the turn entry lists it."""
        entry = await self.ledgers.arecord_violation(
            turn_number=turn,
            operation=violation.operation,
            target=violation.target,
            capability=violation.capability,
            detail=violation.detail,
        )
        return _violations_of(entry)

    async def _record(
        self,
        turn: int,
        request: dict[str, object],
        result: TurnResult,
        violations: Sequence[Mapping[str, object]],
        *,
        declared: Sequence[DeclaredOutput],
        header: PromptHeader | None,
    ) -> tuple[LedgerEntry, LedgerEntry]:
        summary = {
            "status": result.status,
            "exit_code": result.exit_code,
            "realized_writes": [w.to_dict() for w in result.realized_writes],
            "promoted_outputs": [p.to_dict() for p in result.promoted_outputs],
        }
        evidence_extra: dict[str, object] = {
            "enforcement": dict(result.enforcement),
            "realized_writes": [w.to_dict() for w in result.realized_writes],
            "promoted_outputs": [p.to_dict() for p in result.promoted_outputs],
            "surface_problems": [p.to_dict() for a in result.attempts[-1:] for p in a.problems],
        }
        if header is not None:
            evidence_extra["prompt_header"] = header.to_dict()
        entries = await self.ledgers.arecord_turn(
            turn_number=turn,
            query_hash=_digest(request),
            result_hash=_digest(summary),
            status=result.status,
            declared_reads=list(request.get("declared_inputs", [])),  # type: ignore[call-overload]
            declared_writes=[d.to_dict() for d in declared],
            capability_violations=list(violations),
            exec_extra={
                "argv": request["argv"],
                "exit_code": result.exit_code,
                "fault_type": result.fault_type,
                "verdict": result.verdict,
                "reason_code": result.reason_code,
                "attempt_count": len(result.attempts),
                "duration_ms": result.duration_ms,
                "attempts": [a.ledger_summary() for a in result.attempts],
            },
            evidence_extra=evidence_extra,
        )
        self._turn_recorded = True
        return entries

    async def _run(
        self,
        progress: _TurnProgress,
        *,
        argv: list[str],
        declared_outputs: object,
        declared_inputs: tuple[str, ...],
        phase: AgentPhase | None,
        timeout_ms: int | None,
        turn: int,
        options: RetryOptions,
        delay: Callable[[float], Awaitable[None]],
        entropy_detector: EntropyDetector | None,
    ) -> TurnResult:
        start_ns = time.monotonic_ns()
        request: dict[str, object] = {
            "argv": argv,
            "declared_outputs": _plain(declared_outputs),
            "declared_inputs": list(declared_inputs),
            "phase": None if phase is None else phase.value,
            "timeout_ms": timeout_ms,
        }
        progress.request = request
        levels: Mapping[str, str] = dict(self.runtime.levels)
        try:
            self.runtime.require_enforcement()
        except SandboxUnavailableError as exc:
            await self._reject(
                turn,
                request,
                start_ns,
                reason_code=SANDBOX_UNAVAILABLE,
                reason=str(exc),
                violation=None,
                levels=levels,
            )
            raise
        try:
            exe, declared = self._check_request(argv, declared_outputs, turn)
        except DeclarationError as exc:
            return await self._reject(
                turn,
                request,
                start_ns,
                reason_code=DECLARATION_INVALID,
                reason=str(exc),
                violation=None,
                levels=levels,
            )
        except CapabilityViolation as exc:
            return await self._reject(
                turn,
                request,
                start_ns,
                reason_code=CAPABILITY_REJECTED,
                reason=str(exc),
                violation=exc,
                levels=levels,
            )
        levels = self._ensure_confinement()
        header = self.prompt_header(
            turn_number=turn,
            declared_inputs=declared_inputs,
            declared_outputs=[d.to_dict() for d in declared],
        )
        limits = self.package.manifest.limits
        cfg = self.runtime.config
        timeout_s = (
            (timeout_ms / 1000) if timeout_ms is not None else (limits.timeout_s or cfg.timeout_s)
        )
        timeout_s = min(timeout_s, limits.timeout_s or cfg.timeout_s)
        _log.info(
            "turn_started",
            session_id=self.session_id,
            turn_number=turn,
            argv=argv,
            phase=request["phase"],
            timeout_ms=int(timeout_s * 1000),
        )
        attempts = progress.attempts
        violations = progress.violations
        recorded = progress.recorded

        async def one_attempt(attempt: LoopRecord) -> AttemptReport[_ConfinedRun]:
            """The runner of THE attempt loop: one confined run of the command."""
            record, outcome, surface, attempt_violations = await self._attempt(
                exe=exe,
                argv=argv,
                declared=declared,
                turn=turn,
                attempt_no=attempt.attempt,
                timeout_s=timeout_s,
            )
            for v in attempt_violations:
                recorded.extend(await self._record_violation(turn, v))
                violations.append(v)
            hooks.last = _ConfinedRun(record, outcome, surface)
            return AttemptReport(
                outcome=outcome, payload=hooks.last, duration_ms=record.duration_ms
            )

        def finished(run: _ConfinedRun, decision: AttemptDecision) -> None:
            record = _with_decision(run.record, run.outcome, decision)
            attempts.append(record)
            _log.info(
                "attempt_finished",
                session_id=self.session_id,
                turn_number=turn,
                attempt=record.attempt_number,
                exit_code=record.exit_code,
                verdict=record.verdict,
                reason_code=record.reason_code,
                duration_ms=record.duration_ms,
            )

        hooks = _ProcessHooks(self.session_id, turn, finished)
        end = await run_attempts(
            one_attempt,
            phase=phase,
            options=options,
            clock=_now_us,
            sleep=delay,
            hooks=hooks,
            execution_id=self.session_id,
            instruction_id=lambda _n: f"{self.session_id}#{turn}",
        )
        # No drain and no interrupted attempt here: the loop always ends with a report.
        assert end is not None
        assert end.report is not None
        decision = end.decision
        last_outcome = end.outcome
        finished(end.report.payload, decision)
        if decision.verdict is Verdict.SUCCEED:
            realized = end.report.payload.surface.in_area("output")
            # Each promoted file goes onto `progress` as it lands (in the worker thread):
            # neither a later file failing nor a cancellation meanwhile loses the record
            # of what already reached the workspace.
            promote = functools.partial(promote_outputs, done=progress.promoted)
            try:
                await anyio.to_thread.run_sync(
                    promote,
                    self.output_dir,
                    [realized[d.path] for d in declared],
                    self.workspace,
                )
            except (PromotionError, OSError) as exc:
                v = self._violation(
                    turn, "promote", str(self.workspace), "declared_outputs", str(exc)
                )
                recorded.extend(await self._record_violation(turn, v))
                violations.append(v)
                decision = AttemptDecision(
                    Verdict.TERMINATE,
                    PROMOTION_FAILED,
                    str(exc),
                    fault_type=ExecutionFaultType.SECURITY_VIOLATION,
                )
        if decision.record_entropy and entropy_detector is not None and phase is not None:
            entropy_detector.record(
                ToolCall(
                    id=f"{self.session_id}#{turn}", name=argv[0], arguments={"argv": list(argv)}
                ),
                phase,
            )
        status = _status(decision, last_outcome, bool(violations))
        last = attempts[-1]
        result = TurnResult(
            session_id=self.session_id,
            turn_number=turn,
            status=status,
            exit_code=last.exit_code,
            fault_type=None if decision.fault_type is None else decision.fault_type.value,
            verdict=decision.verdict.value,
            reason_code=decision.reason_code,
            reason=decision.reason,
            attempts=tuple(attempts),
            realized_writes=last.realized_writes,
            violations=tuple(violations),
            promoted_outputs=tuple(progress.promoted),
            duration_ms=_ms_since(start_ns),
            enforcement=dict(levels),
            stdout=last.stdout,
            stderr=last.stderr,
        )
        await self._record(turn, request, result, recorded, declared=declared, header=header)
        _log.info(
            "turn_finished",
            session_id=self.session_id,
            turn_number=turn,
            status=status,
            reason_code=result.reason_code,
            duration_ms=result.duration_ms,
        )
        return result

    def _env(self, turn: int) -> tuple[tuple[str, str], ...]:
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
            if name in os.environ:
                env[name] = os.environ[name]
        return tuple(env.items())

    def _rlimits(self) -> tuple[tuple[int, int, int], ...]:
        import resource

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
        return tuple(out)

    async def _attempt(
        self,
        *,
        exe: str,
        argv: list[str],
        declared: tuple[DeclaredOutput, ...],
        turn: int,
        attempt_no: int,
        timeout_s: float,
    ) -> tuple[AttemptRecord, AttemptOutcome, WriteSurface, list[CapabilityViolation]]:
        start_ns = time.monotonic_ns()
        cfg = self.runtime.config
        limits = self.package.manifest.limits
        self._prepare_dirs()
        levels = self._ensure_confinement()
        cg = self._turn_cgroup()
        baseline = cg.resource_events()
        out_fd = os.memfd_create("hunter-stdout", os.MFD_CLOEXEC)
        try:
            err_fd = os.memfd_create("hunter-stderr", os.MFD_CLOEXEC)
        except BaseException:
            os.close(out_fd)
            raise
        timed_out = False
        leftovers = 0
        status: int | None = None
        launcher = levels.get("launcher", "native")
        try:
            procs_fds = cg.open_procs_fds()
            try:
                spawned = spawn(
                    SpawnRequest(
                        path=exe,
                        argv=tuple(argv),
                        env=self._env(turn),
                        cwd=str(self.output_dir),
                        stdin_fd=self.runtime.stdin_fd(),
                        stdout_fd=out_fd,
                        stderr_fd=err_fd,
                        uid=self.uid,
                        gid=self.gid,
                        netns_fd=self._netns_fd,
                        landlock_fd=self._ruleset_fd,
                        cgroup_fds=tuple(procs_fds),
                        rlimits=self._rlimits(),
                    ),
                    launcher=cfg.launcher,
                )
            finally:
                close_quietly(procs_fds)
            launcher = spawned.launcher
            try:
                with anyio.move_on_after(timeout_s) as scope:
                    await anyio.wait_readable(spawned.pidfd)
                if scope.cancelled_caught:
                    timed_out = True
                    cg.signal_all(signal.SIGTERM)
                    with anyio.move_on_after(cfg.kill_grace_s):
                        await anyio.wait_readable(spawned.pidfd)
                    cg.kill_all()
                    if not cg.dirs:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(spawned.pid, signal.SIGKILL)
                    with anyio.CancelScope(shield=True):
                        await anyio.wait_readable(spawned.pidfd)
                if not cg.dirs:
                    # No cgroup: the process group is the only handle on what the command
                    # left running in the background. Kill it before reaping the leader (so
                    # the group id cannot have been reused) and before enumeration/promotion.
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(spawned.pid, signal.SIGKILL)
                status = reap(spawned)
            finally:
                if status is None:  # cancelled from outside: never leave the tree behind
                    cg.kill_all()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(spawned.pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        reap(spawned)
                os.close(spawned.pidfd)
                leftovers = len(cg.members())
                if leftovers:
                    cg.kill_all()
                with anyio.CancelScope(shield=True):
                    empty = await cg.wait_empty()
                if not empty:
                    _log.error(
                        "turn_processes_survived",
                        session_id=self.session_id,
                        turn_number=turn,
                        pids=cg.members(),
                    )
                    self._drop_cgroup()
            now = cg.resource_events()
            events = {key: now[key] - baseline.get(key, 0) for key in now}
        except SpawnError as exc:
            close_quietly((out_fd, err_fd))
            return self._spawn_failed(exc, attempt_no, start_ns, launcher)
        except BaseException:
            close_quietly((out_fd, err_fd))
            raise
        cap = limits.output_bytes or cfg.output_bytes
        stdout, out_trunc = _read_capped(out_fd, cap)
        stderr, err_trunc = _read_capped(err_fd, cap)
        capture_max = max(os.fstat(out_fd).st_size, os.fstat(err_fd).st_size)
        close_quietly((out_fd, err_fd))
        exit_code: int | None = None
        sig: int | None = None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        elif os.WIFEXITED(status):
            exit_code = os.WEXITSTATUS(status)
        areas = {"output": self.output_dir, "tmp": self.tmp_dir}
        if _all_empty(areas.values()):
            surface = WriteSurface((), ())  # nothing to walk: skip the worker thread
        else:
            surface = await anyio.to_thread.run_sync(enumerate_writes, areas)
        disk_limit = (limits.disk_mb or cfg.disk_mb) << 20
        fsize = (limits.file_size_mb or cfg.file_size_mb) << 20
        exhausted = (
            events["oom_kill"] > 0
            or events["pids_max"] > 0
            or sig == _SIGXFSZ
            or exit_code == 128 + _SIGXFSZ  # a shell reporting a child killed by SIGXFSZ
            or surface.total_bytes > disk_limit
            # a file (or the captured output) that reached RLIMIT_FSIZE was cut off by it
            or max((w.size for w in surface.writes), default=0) >= fsize
            or capture_max >= fsize
        )
        violations = self._surface_violations(
            surface, declared, turn, check_missing=exit_code == 0 and not timed_out
        )
        outcome = AttemptOutcome.from_exit_code(
            exit_code,
            killed_by_signal=sig,
            timed_out=timed_out,
            resource_exhausted=exhausted,
            security_violation=bool(violations),
        )
        record = AttemptRecord(
            attempt_number=attempt_no,
            exit_code=exit_code,
            signal=sig,
            timed_out=timed_out,
            resource_exhausted=exhausted,
            security_violation=bool(violations),
            outcome=outcome.kind.value,
            fault_type=None if outcome.fault_type is None else outcome.fault_type.value,
            verdict="",
            reason_code="",
            reason="",
            delay_ms=0,
            duration_ms=_ms_since(start_ns),
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=out_trunc,
            stderr_truncated=err_trunc,
            leftover_processes=leftovers,
            resource_events=events,
            realized_writes=surface.writes,
            problems=surface.problems,
            launcher=launcher,
        )
        return record, outcome, surface, violations

    def _spawn_failed(
        self, exc: SpawnError, attempt_no: int, start_ns: int, launcher: str
    ) -> tuple[AttemptRecord, AttemptOutcome, WriteSurface, list[CapabilityViolation]]:
        outcome = AttemptOutcome.fault(ExecutionFaultType.CRASH, f"{SPAWN_FAILED}: {exc}")
        record = AttemptRecord(
            attempt_number=attempt_no,
            exit_code=None,
            signal=None,
            timed_out=False,
            resource_exhausted=False,
            security_violation=False,
            outcome=outcome.kind.value,
            fault_type=ExecutionFaultType.CRASH.value,
            verdict="",
            reason_code="",
            reason="",
            delay_ms=0,
            duration_ms=_ms_since(start_ns),
            stdout="",
            stderr=str(exc),
            stdout_truncated=False,
            stderr_truncated=False,
            leftover_processes=0,
            resource_events={},
            realized_writes=(),
            problems=(),
            launcher=launcher,
        )
        return record, outcome, WriteSurface((), ()), []

    def _surface_violations(
        self,
        surface: WriteSurface,
        declared: Sequence[DeclaredOutput],
        turn: int,
        *,
        check_missing: bool,
    ) -> list[CapabilityViolation]:
        """FR-RT-015/016: special files anywhere, undeclared or missing outputs."""
        out: list[CapabilityViolation] = []
        for problem in surface.problems:
            out.append(
                self._violation(
                    turn,
                    "write",
                    f"{problem.area}/{problem.path}",
                    "write_surface",
                    f"{problem.kind} in the sandbox",
                )
            )
        realized = surface.in_area("output")
        wanted = {d.path for d in declared}
        for path in sorted(set(realized) - wanted):
            out.append(self._violation(turn, "write", path, "declared_outputs", "undeclared write"))
        if check_missing:
            for path in sorted(wanted - set(realized)):
                out.append(
                    self._violation(
                        turn, "write", path, "declared_outputs", "declared output missing"
                    )
                )
        return out

    async def record_instruction_turn(
        self,
        *,
        turn_number: int,
        instruction: Mapping[str, object],
        result: Mapping[str, object],
        status: str,
        external_calls: Iterable[object] = (),
        declared_reads: Iterable[object] = (),
        declared_writes: Iterable[object] = (),
        capability_violations: Iterable[Mapping[str, object]] = (),
        exec_extra: Mapping[str, object] | None = None,
        evidence_extra: Mapping[str, object] | None = None,
    ) -> tuple[LedgerEntry, LedgerEntry]:
        """Write both ledger entries of an executor (instruction) turn."""
        self.next_turn_number = max(self.next_turn_number, turn_number + 1)
        return await self.ledgers.arecord_turn(
            turn_number=turn_number,
            query_hash=_digest(instruction),
            result_hash=_digest(result),
            status=status,
            declared_reads=declared_reads,
            declared_writes=declared_writes,
            external_calls=external_calls,
            capability_violations=capability_violations,
            exec_extra=exec_extra,
            evidence_extra=evidence_extra,
        )

    def close(self) -> None:
        """Close the ledgers and release the session's fds and uid (idempotent)."""
        if self._closed:
            return
        self._closed = True
        close_quietly([fd for fd in (self._netns_fd, self._ruleset_fd) if fd >= 0])
        self._netns_fd = self._ruleset_fd = -1
        self._drop_cgroup()
        if self.uid > 0:
            self.runtime.release_uid(self.uid)
        self.ledgers.close()

    async def aclose(self) -> None:
        """``close`` in a worker thread (the ledgers sync on close)."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlink_non_directories(dir_fd: int) -> list[str]:
    """Unlink every entry of *dir_fd* that is not a directory; return the directories."""
    with os.scandir(dir_fd) as entries:
        listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    subdirs: list[str] = []
    for name, is_dir in listed:
        if is_dir:
            subdirs.append(name)
        else:
            os.unlink(name, dir_fd=dir_fd)
    return subdirs


def _empty_directory(path: Path) -> None:
    """Remove everything inside *path* (kept itself), never following a symlink.

    Iterative (``shutil.rmtree`` recurses in Python and fails on the thousands of nested
    directories a turn can leave, which would stop every later attempt of the session);
    one directory fd stays open per level of the current path.
    """
    stack: list[tuple[int, list[str]]] = []
    top = os.open(path, _DIR_FLAGS)
    try:
        stack.append((top, _unlink_non_directories(top)))
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            dir_fd, subdirs = stack[-1]
            if subdirs:
                child = os.open(subdirs[-1], _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    stack.append((child, _unlink_non_directories(child)))
                except BaseException:
                    os.close(child)
                    raise
                continue
            stack.pop()
            os.close(dir_fd)
            if stack:
                parent_fd, siblings = stack[-1]
                os.rmdir(siblings.pop(), dir_fd=parent_fd)
    finally:
        for dir_fd, _subdirs in stack:
            os.close(dir_fd)


def _all_empty(directories: Iterable[Path]) -> bool:
    for directory in directories:
        try:
            with os.scandir(directory) as entries:
                if next(entries, None) is not None:
                    return False
        except FileNotFoundError:
            continue
    return True


def _plain(value: object) -> object:
    if isinstance(value, DeclaredOutput):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return repr(value)


def _violations_of(entry: LedgerEntry) -> list[dict[str, object]]:
    items = entry.get("capability_violations", [])
    if not isinstance(items, (list, tuple)):
        return []
    return [dict(v) for v in items if isinstance(v, Mapping)]


def _read_capped(fd: int, cap: int) -> tuple[str, bool]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, cap), 0) if size else b""
    return data.decode("utf-8", "replace"), size > cap


def _with_decision(
    record: AttemptRecord, outcome: AttemptOutcome, decision: AttemptDecision
) -> AttemptRecord:
    from dataclasses import replace

    return replace(
        record,
        verdict=decision.verdict.value,
        reason_code=decision.reason_code,
        reason=decision.reason,
        delay_ms=decision.delay_ms,
        fault_type=(
            outcome.fault_type.value if outcome.fault_type is not None else record.fault_type
        ),
    )


def _status(decision: AttemptDecision, outcome: AttemptOutcome, violated: bool) -> TurnStatus:
    if violated:
        return "violation"
    if decision.verdict is Verdict.SUCCEED:
        return "succeeded"
    if decision.verdict is Verdict.EXHAUSTED:
        return "exhausted"
    if decision.verdict is Verdict.ESCALATE:
        return "escalated"
    if outcome.fault_type is ExecutionFaultType.TIMEOUT:
        return "timeout"
    if outcome.kind is OutcomeKind.FAILURE:
        return "failed"
    return "terminated"
