"""How a runtime confines turns (`RuntimeConfig`) and the paths every turn may read.

Apart from `runtime` so that what the runtime's sessions, areas and attempts read of it (the
`view.RuntimeView` seam) can name its type without importing the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from sandbox.capabilities import DEFAULT_TURN_PATH
from sandbox.confine.audit import AuditMode

__all__ = ["DEFAULT_LOADER_PATHS", "DEFAULT_SYSTEM_READ_PATHS", "RuntimeConfig"]

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
    # read at start by ordinary programs (Python's locale set-up, coreutils' libselinux,
    # id/getgroups): constants of the host, harmless, and a denial of each would otherwise
    # be a capability violation of every such turn (sandbox.confine.audit)
    "/etc/locale.alias",
    "/proc/filesystems",
    "/proc/sys/kernel/ngroups_max",
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
    #: Landlock's denials on the evidence record (`sandbox.confine.audit`): ``enable`` turns
    #: the kernel's audit on when it is off, ``auto`` uses it only when on, ``off`` never
    kernel_audit: AuditMode = "enable"
    #: ``tmpfs``: each session's ``tmp/`` and ``output/`` on one tmpfs of ``disk_mb`` (a hard
    #: bound, root only); ``none``: only ``RLIMIT_FSIZE`` and the post-run ``disk_mb`` check
    session_disk: Literal["tmpfs", "none"] = "tmpfs"
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
