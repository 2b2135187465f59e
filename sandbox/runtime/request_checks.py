"""The checks a process turn's request passes before anything runs: ``argv``, the one
``declared_outputs`` parser of ``sandbox.policy.declarations``, the executable and every
declared destination against the session's capabilities.

Apart from `process_turn` because two callers ask them (the daemon's intake, through
`Session.check_turn_request`, and the turn itself before its first attempt) and because they
change with the capability rules, not with how a turn runs. They read the session through the
narrow `RequestScope` seam and do no I/O beyond resolving the command on the search path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandbox.capabilities import resolve_command
from sandbox.errors import DeclarationError
from sandbox.policy.declarations import DeclarationProblem, DeclaredOutput
from sandbox.policy.declarations import parse_declared_outputs as _parse_declared_outputs
from sandbox.runtime.attempt import capability_violation
from sandbox.runtime.view import RuntimeView

if TYPE_CHECKING:
    from sandbox.capabilities import CompiledCapabilities

__all__ = ["RequestScope", "check_request", "parse_declared_outputs"]


class RequestScope(Protocol):
    """What the checks read of the session a request is for (`session.Session`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def runtime(self) -> RuntimeView: ...

    @property
    def capabilities(self) -> CompiledCapabilities: ...

    @property
    def workspace(self) -> Path: ...

    @property
    def output_dir(self) -> Path: ...


def parse_declared_outputs(declared: object) -> tuple[DeclaredOutput, ...]:
    """Validate ``declared_outputs`` (FR-RT-013) with the one parser of
    ``sandbox.policy.declarations``; raise ``DeclarationError`` naming the field."""
    try:
        return _parse_declared_outputs(declared)
    except DeclarationProblem as exc:
        raise DeclarationError(field=exc.field, problem=exc.problem) from None


def check_request(
    session: RequestScope, argv: Sequence[str], declared_outputs: object, turn: int
) -> tuple[str, tuple[DeclaredOutput, ...]]:
    """Validate a request; return the resolved executable and the declarations.

    Raises ``DeclarationError`` (shape) or ``CapabilityViolation`` (not allowed).
    """
    items: Sequence[object] = argv
    if not items or not all(isinstance(a, str) and "\0" not in a for a in items):
        raise DeclarationError(field="argv", problem="a non-empty list of strings")
    declared = parse_declared_outputs(declared_outputs)
    exe = resolve_command(
        argv[0], cwd=session.output_dir, search_path=session.runtime.config.turn_path
    )
    if exe is None:
        raise capability_violation(
            session.session_id,
            turn,
            "execute",
            argv[0],
            "capabilities.execute",
            "command not found or not executable",
        )
    check = session.capabilities.check_execute(exe, args=argv[1:])
    if not check.allowed:
        detail = f"resolved to {exe}"
        if check.matched:
            detail += f"; matches forbidden pattern {check.matched!r}"
        if check.reason:
            detail += f"; {check.reason}"
        raise capability_violation(
            session.session_id, turn, "execute", argv[0], check.capability, detail
        )
    for out in declared:
        if out.is_scratch:  # never promoted: it names no destination in the workspace
            continue
        wcheck = session.capabilities.check_write(session.workspace / out.path)
        if not wcheck.allowed:
            detail = f"destination {wcheck.path}"
            if wcheck.matched:
                detail += f"; matches forbidden pattern {wcheck.matched!r}"
            raise capability_violation(
                session.session_id, turn, "declare", out.path, wcheck.capability, detail
            )
    return exe, declared
