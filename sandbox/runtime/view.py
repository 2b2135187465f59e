"""What a runtime's sessions, areas and confined runs read of it: the `RuntimeView` seam.

`runtime.Runtime` makes sessions (`session.Session`) and their areas (`area.SessionArea`), and
those reach back to it for its configuration, its enforcement levels, the uid pool and the
kernel's audit. They see it through this Protocol, so that the modules below `runtime` never
import it (the package's layering: runtime -> session -> area, process_turn -> attempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandbox.capabilities import CompiledCapabilities
from sandbox.confine.audit import KernelAudit
from sandbox.confine.cgroups import CgroupLayout
from sandbox.packages import Package
from sandbox.runtime.config import RuntimeConfig

if TYPE_CHECKING:
    from sandbox.runtime.confined_area import ConfinedArea

__all__ = ["RuntimeView"]


class RuntimeView(Protocol):
    """The runtime as its sessions, areas and confined runs see it."""

    @property
    def root(self) -> Path:
        """The runtime's root directory."""
        ...

    @property
    def config(self) -> RuntimeConfig:
        """How turns are confined."""
        ...

    @property
    def levels(self) -> Mapping[str, str]:
        """Each confinement mechanism's enforcement level on this machine."""
        ...

    @property
    def layout(self) -> CgroupLayout:
        """The detected cgroup layout."""
        ...

    @property
    def cgroup_prefix(self) -> str:
        """The prefix of every cgroup leaf name of this root."""
        ...

    @property
    def forbidden_sockets(self) -> tuple[Path, ...]:
        """Sockets no turn may reach (the daemon's own)."""
        ...

    @property
    def audit(self) -> KernelAudit | None:
        """Where Landlock's denials are read from (None: blocked but not recorded)."""
        ...

    @property
    def landlock_flags(self) -> int:
        """`landlock_restrict_self` flags of every turn."""
        ...

    def allocate_uid(self, session_id: str) -> tuple[int, int]:
        """A uid (and gid) for a session."""
        ...

    def release_uid(self, uid: int) -> None:
        """Return a session's uid to the pool."""
        ...

    def is_sandbox_uid(self, uid: int) -> bool:
        """Whether *uid* is one this runtime hands to sessions."""
        ...

    def stdin_fd(self) -> int:
        """A shared read-only ``/dev/null`` fd, every turn's stdin."""
        ...

    def require_enforcement(self) -> None:
        """Raise ``SandboxUnavailableError`` in strict mode when a mechanism is missing."""
        ...

    def new_area(
        self, session_id: str, package: Package, capabilities: CompiledCapabilities, workspace: Path
    ) -> ConfinedArea:
        """A session's confined area."""
        ...
