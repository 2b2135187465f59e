"""One confined run of a process turn: spawn, wait with a deadline, kill the tree, capture,
enumerate the writes, and map how it ended to an `AttemptOutcome` (docs/policy.md,
"How the seeds combine", item 3). What the policy then decides is not this module's business.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import anyio
import structlog

from sandbox.confine.audit import DenialWatch, KernelAudit, as_kernel_denial
from sandbox.confine.procs import reap_orphans
from sandbox.confine.seccomp import KernelDenial, NotificationServer
from sandbox.confine.spawn import Spawned, SpawnRequest, close_quietly, reap, spawn
from sandbox.enumerate import WriteSurface, enumerate_writes
from sandbox.errors import CapabilityViolation, SpawnError
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.declarations import DeclaredOutput, compare_surface, surface_target
from sandbox.policy.denials import is_violation
from sandbox.runs import ConfinedRun, ProcessAttempt, crashed_run, ms_since
from sandbox.runtime.directories import all_empty
from sandbox.runtime.view import RuntimeView

if TYPE_CHECKING:
    from sandbox.confine.cgroups import TurnCgroup
    from sandbox.packages import Package

__all__ = [
    "SPAWN_FAILED",
    "ConfinedRun",
    "ProcessAttempt",
    "capability_violation",
    "crashed_run",
    "run_confined",
]

_log = structlog.get_logger("sandbox.runtime.attempt")


class RunArea(Protocol):
    """The area a confined run takes place in (`area.SessionArea`, which calls `run_confined`:
    this module sits below it)."""

    @property
    def runtime(self) -> RuntimeView: ...

    @property
    def session_id(self) -> str: ...

    @property
    def package(self) -> Package: ...

    @property
    def tmp_dir(self) -> Path: ...

    @property
    def output_dir(self) -> Path: ...

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...

    @property
    def netns_fd(self) -> int: ...

    @property
    def ruleset_fd(self) -> int: ...

    @property
    def network_granted(self) -> bool: ...

    def prepare(self) -> None: ...

    def ensure_confinement(self) -> dict[str, str]: ...

    def turn_cgroup(self) -> TurnCgroup: ...

    def drop_cgroup(self) -> None: ...

    def env(self, turn: int) -> tuple[tuple[str, str], ...]: ...

    def rlimits(self) -> tuple[tuple[int, int, int], ...]: ...

    def seccomp_program(self) -> bytes | None: ...

    def disk_full(self) -> bool: ...


_SIGXFSZ: Final = int(signal.SIGXFSZ)
#: Reason code of a launcher that could not start the command (the attempt is a CRASH).
SPAWN_FAILED: Final = "SPAWN_FAILED"


def capability_violation(  # noqa: PLR0917 (the violation's own fields, in order)
    session_id: str, turn: int, operation: str, target: str, capability: str, detail: str
) -> CapabilityViolation:
    """A `CapabilityViolation` of turn *turn* of the session."""
    return CapabilityViolation(
        operation=operation,
        target=target,
        capability=capability,
        session_id=session_id,
        turn_number=turn,
        detail=detail,
    )


def catches(pid: int, sig: int) -> bool:
    """Whether process *pid* has a handler for *sig* (``SigCgt`` in ``/proc/<pid>/status``);
    True when it cannot be told (the grace is then waited as before)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return True
    return True


async def run_confined(
    area: RunArea,
    *,
    exe: str,
    argv: list[str],
    declared: tuple[DeclaredOutput, ...],
    turn: int,
    attempt_no: int,
    timeout_s: float,
) -> ConfinedRun:
    """Run the command once, confined, in *area*; never raises for a failed run.

    The area is emptied first; the process tree is dead when this returns (also when the
    caller is cancelled). A launcher failure is a CRASH fault, not an exception.
    """
    start_ns = time.monotonic_ns()
    start_us = time.time_ns() // 1000
    cfg = area.runtime.config
    limits = area.package.manifest.limits
    area.prepare()
    levels = area.ensure_confinement()
    cg = area.turn_cgroup()
    baseline = cg.events_before()
    out_fd = os.memfd_create("hunter-stdout", os.MFD_CLOEXEC)
    try:
        err_fd = os.memfd_create("hunter-stderr", os.MFD_CLOEXEC)
    except BaseException:
        os.close(out_fd)
        raise
    denials: list[KernelDenial] = []
    launcher = levels.get("launcher", "native")
    try:
        procs_fds = cg.open_procs_fds()
        try:
            spawned = spawn(
                SpawnRequest(
                    path=exe,
                    argv=tuple(argv),
                    env=area.env(turn),
                    cwd=str(area.output_dir),
                    stdin_fd=area.runtime.stdin_fd(),
                    stdout_fd=out_fd,
                    stderr_fd=err_fd,
                    uid=area.uid,
                    gid=area.gid,
                    netns_fd=area.netns_fd,
                    landlock_fd=area.ruleset_fd,
                    landlock_flags=area.runtime.landlock_flags,
                    cgroup_fds=tuple(procs_fds),
                    rlimits=area.rlimits(),
                    seccomp=area.seccomp_program(),
                    seccomp_notify=True,
                    new_pid_ns=area.runtime.levels.get("pid_namespace") == "per-turn",
                ),
                launcher=cfg.launcher,
            )
        finally:
            close_quietly(procs_fds)
        launcher = spawned.launcher
        audit = area.runtime.audit
        # registered before anything awaits: no record of this domain can be read before it
        watch = audit.watch(spawned.pid) if audit is not None else None
        server = (
            NotificationServer(
                spawned.listener_fd, denials.append, network_granted=area.network_granted
            )
            if spawned.listener_fd >= 0
            else None
        )
        try:
            async with anyio.create_task_group() as tg:
                if server is not None:
                    tg.start_soon(_serve, server, area.session_id, turn)
                timed_out, leftovers, status = await _wait_and_kill(area, spawned, timeout_s, turn)
                tg.cancel_scope.cancel()
            if audit is not None and watch is not None:
                await _landlock_denials(audit, watch, denials, area.session_id, turn)
        finally:
            if server is not None:
                server.close()
            if audit is not None and watch is not None:
                audit.unwatch(watch)
        now = cg.events_after()
        events = {key: now[key] - baseline.get(key, 0) for key in now}
    except SpawnError as exc:
        close_quietly((out_fd, err_fd))
        return _spawn_failed(exc, attempt_no, start_ns, launcher)
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
    areas = {"output": area.output_dir, "tmp": area.tmp_dir}
    if all_empty(areas.values()):
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
        or area.disk_full()  # the session disk (a tmpfs of disk_mb) is full: ENOSPC was hit
        # a file (or the captured output) that reached RLIMIT_FSIZE was cut off by it
        or max((w.size for w in surface.writes), default=0) >= fsize
        or capture_max >= fsize
    )
    violations = [
        capability_violation(area.session_id, turn, d.operation, d.target, d.capability, d.detail)
        for d in denials
    ]
    violations += _surface_violations(
        area.session_id, surface, declared, turn, check_missing=exit_code == 0 and not timed_out
    )
    outcome = AttemptOutcome.from_exit_code(
        exit_code,
        killed_by_signal=sig,
        timed_out=timed_out,
        resource_exhausted=exhausted,
        security_violation=bool(violations),
    )
    record = ProcessAttempt(
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
        duration_ms=ms_since(start_ns),
        started_us=start_us,
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
    return ConfinedRun(record, outcome, surface, violations)


async def _landlock_denials(
    audit: KernelAudit, watch: DenialWatch, denials: list[KernelDenial], session_id: str, turn: int
) -> None:
    """Add the Landlock denials of the attempt (its processes are gone) to *denials*."""
    complete = await audit.barrier()
    denials.extend(
        as_kernel_denial(d, watch.pid) for d in watch.denials if is_violation(d.blockers, d.target)
    )
    if watch.dropped or not complete:
        _log.warning(
            "landlock_denials_incomplete",
            session_id=session_id,
            turn_number=turn,
            recorded=len(watch.denials),
            dropped=watch.dropped,
            barrier_returned=complete,
        )


async def _serve(server: NotificationServer, session_id: str, turn: int) -> None:
    """Answer the turn's seccomp notifications; a failure of the server closes the listener
    (every call it would have answered then fails with ENOSYS: the turn stays confined)."""
    try:
        await server.serve()
    except OSError as exc:
        _log.error(
            "seccomp_listener_failed", session_id=session_id, turn_number=turn, error=str(exc)
        )
        server.close()


async def _wait_and_kill(
    area: RunArea, spawned: Spawned, timeout_s: float, turn: int
) -> tuple[bool, int, int]:
    """Wait for the command (deadline: SIGTERM, grace, kill the tree), reap it, and wait until
    no process of the turn is left; (timed out, processes left after it, wait status)."""
    cfg = area.runtime.config
    cg = area.turn_cgroup()
    timed_out = False
    status: int | None = None
    try:
        with anyio.move_on_after(timeout_s) as scope:
            await anyio.wait_readable(spawned.pidfd)
        if scope.cancelled_caught:
            timed_out = True
            cg.signal_all(signal.SIGTERM)
            # The command is PID 1 of its own PID namespace (per-turn): the kernel drops a
            # signal it has no handler for, so a SIGTERM it does not catch would only make the
            # deadline wait out the whole grace. Such a command is killed at once.
            namespaced = area.runtime.levels.get("pid_namespace") == "per-turn"
            if not namespaced or catches(spawned.pid, signal.SIGTERM):
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
        empty = True  # no member left: nothing to wait for (``members`` is the same read)
        if leftovers:
            cg.kill_all()
            with anyio.CancelScope(shield=True):
                empty = await cg.wait_empty()
        if not empty:
            _log.error(
                "turn_processes_survived",
                session_id=area.session_id,
                turn_number=turn,
                pids=cg.members(),
            )
            area.drop_cgroup()
        levels = area.runtime.levels
        if levels.get("pid_namespace") != "per-turn" and levels.get("subreaper") == "yes":
            reap_orphans(area.runtime.is_sandbox_uid)  # orphans re-parented to us, now dead
    assert status is not None  # only None while an exception propagates
    return timed_out, leftovers, status


def _spawn_failed(exc: SpawnError, attempt_no: int, start_ns: int, launcher: str) -> ConfinedRun:
    return crashed_run(f"{SPAWN_FAILED}: {exc}", str(exc), attempt_no, start_ns, launcher)


def _surface_violations(
    session_id: str,
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
            capability_violation(
                session_id,
                turn,
                "write",
                f"{problem.area}/{problem.path}",
                "write_surface",
                f"{problem.kind} in the sandbox",
            )
        )
    compared = compare_surface(declared, ((w.area, w.path) for w in surface.writes))
    for area, path in compared.undeclared:
        out.append(
            capability_violation(
                session_id,
                turn,
                "write",
                surface_target(area, path),
                "declared_outputs",
                "undeclared write",
            )
        )
    if check_missing:
        for path in compared.missing:
            out.append(
                capability_violation(
                    session_id, turn, "write", path, "declared_outputs", "declared output missing"
                )
            )
    return out


def _read_capped(fd: int, cap: int) -> tuple[str, bool]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, cap), 0) if size else b""
    return data.decode("utf-8", "replace"), size > cap
