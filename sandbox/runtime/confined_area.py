"""The seam between a session and the privileged half of the sandbox: its confined area.

Everything a process turn needs root for sits behind `ConfinedArea`: the session's uid, its
directories and session disk, the Landlock ruleset, network namespace and cgroup, the confined
runs themselves (with the enumeration of their writes, seccomp notifications and kernel audit
records) and the promotion of outputs. The session keeps the rest: the package checks, THE
attempt loop, and every ledger line (only the daemon seals).

Two implementations: `sandbox.runtime.area.SessionArea` does it in this process (the daemon
runs as root), `sandbox.helper.remote.RemoteArea` asks the root sandbox helper over its Unix
socket (the daemon runs unprivileged; docs/operations.md, "Privilege separation").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sandbox.enumerate import RealizedWrite
from sandbox.policy.declarations import DeclaredOutput
from sandbox.promote import PromotedOutput, StagedOutputs

if TYPE_CHECKING:
    from sandbox.packages import Package
    from sandbox.runs import ConfinedRun

__all__ = ["ConfinedArea", "HelperLink", "HelperWelcome", "StagingArea"]


class HelperWelcome(Protocol):
    """What the sandbox helper enforces (`sandbox.helper.wire.Welcome`)."""

    @property
    def levels(self) -> Mapping[str, str]: ...

    @property
    def missing(self) -> Mapping[str, str]: ...


class HelperLink(Protocol):
    """The runtime's view of the root sandbox helper (`sandbox.helper.remote.HelperClient`):
    the runtime asks it what it enforces and for each session's `ConfinedArea`, and never
    imports the helper package (the helper imports the runtime). ``hello`` and ``reset`` raise
    `OSError` or `sandbox.errors.HelperError`."""

    @property
    def path(self) -> Path: ...

    def hello(self) -> HelperWelcome: ...

    def reset(self, owner: Path) -> None: ...

    def area(
        self,
        *,
        session_id: str,
        package: Package,
        workspace: Path,
        forbidden: Sequence[str],
        owner: Path,
    ) -> ConfinedArea: ...


class ConfinedArea(Protocol):
    """A session's confined area; ``open`` and ``close`` block (call them in a thread)."""

    @property
    def session_id(self) -> str: ...

    @property
    def tmp_dir(self) -> Path:
        """``tmp/<sid>``: the turn's HOME and TMPDIR."""
        ...

    @property
    def output_dir(self) -> Path:
        """``output/<sid>``: the turn's working directory, where it writes its outputs."""
        ...

    @property
    def uid(self) -> int:
        """The session's unprivileged uid (-1 when turns run as the runtime's own uid)."""
        ...

    @property
    def gid(self) -> int: ...

    def open(self) -> None:
        """Take the session's uid and prepare its directories (blocking)."""
        ...

    def close(self) -> None:
        """Give back the uid, cgroup, directories and fds (blocking, idempotent)."""
        ...

    async def confinement(self) -> dict[str, str]:
        """Build what every attempt of the session reuses; the enforcement levels of its
        turns (the runtime's, with the session's grants)."""
        ...

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
        """Run the command once, confined; its process tree is dead on return (also when
        cancelled). A failed run is a result, never an exception."""
        ...

    async def promote(
        self, writes: Sequence[RealizedWrite], workspace: Path, *, done: list[PromotedOutput]
    ) -> None:
        """Promote *writes* of ``output/<sid>`` into *workspace*, all or nothing
        (`sandbox.promote.promote_outputs`: `PromotionError`, or the ``OSError``); the promoted
        files are appended to *done* once all are in place, even when the caller is
        cancelled meanwhile."""
        ...

    async def empty(self) -> None:
        """Empty ``tmp/<sid>`` and ``output/<sid>`` once a turn has ended."""
        ...


@runtime_checkable
class StagingArea(Protocol):
    """An area that can stage a promotion and place it later (the local one): its caller
    records the turn in between (`sandbox.promote.stage_outputs`)."""

    async def stage(self, writes: Sequence[RealizedWrite], workspace: Path) -> StagedOutputs:
        """Check and stage *writes* of ``output/<sid>`` beside their destinations in
        *workspace*, nothing in place yet (`PromotionError`, or the ``OSError``)."""
        ...
