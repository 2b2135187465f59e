"""Exceptions of the sandbox edge (packages, capabilities, process turns).

Each exception says when it is raised and carries structured keyword fields that logs and
the evidence ledger record. The pure policy core has its own ``policy_errors.py``.
"""

from __future__ import annotations

__all__ = [
    "CapabilityViolation",
    "ConfinementLostError",
    "DeclarationError",
    "HelperError",
    "ManifestError",
    "PackageNotFoundError",
    "SandboxError",
    "SandboxUnavailableError",
    "SessionNotFoundError",
    "SpawnError",
]


class SandboxError(Exception):
    """Base class of every error raised by the sandbox edge."""


class PackageNotFoundError(SandboxError, LookupError):
    """Raised when ``installed/<package_id>/manifest.json`` does not exist (FR-RT-001).

    ``package_id`` is the id asked for, ``path`` the manifest path that was looked up.
    """

    def __init__(self, *, package_id: str, path: str) -> None:
        self.package_id = package_id
        self.path = path
        super().__init__(f"package {package_id!r} not found: {path} does not exist")


class ManifestError(SandboxError, ValueError):
    """Raised when a manifest is not valid JSON or breaks the schema (docs/sandbox.md).

    ``path`` is the manifest file, ``json_path`` the JSON path of the offending value
    (``$.capabilities.read[2]``) and ``problem`` what is wrong with it.
    """

    def __init__(self, *, path: str, json_path: str, problem: str) -> None:
        self.path = path
        self.json_path = json_path
        self.problem = problem
        super().__init__(f"{path}: {json_path}: {problem}")


class CapabilityViolation(SandboxError):
    """Raised when an operation is outside the session's capabilities (FR-RT-003/010/016).

    Raised before a turn runs (command not in ``execute``, declared output not writable or
    forbidden) and after it (realized writes differ from the declaration, a symlink/hard
    link/special file in the sandbox). The violation is written to the evidence ledger before
    this is raised. ``operation`` is ``execute``/``write``/``read``/``declare``,
    ``target`` the path or command, ``capability`` the capability violated
    (``capabilities.execute``, ``capabilities.forbidden``, ``declared_outputs`` ...).
    """

    def __init__(
        self,
        *,
        operation: str,
        target: str,
        capability: str,
        session_id: str = "",
        turn_number: int = 0,
        detail: str = "",
    ) -> None:
        self.operation = operation
        self.target = target
        self.capability = capability
        self.session_id = session_id
        self.turn_number = turn_number
        self.detail = detail
        msg = f"{operation} {target!r} violates {capability}"
        if detail:
            msg = f"{msg}: {detail}"
        super().__init__(msg)

    def to_dict(self) -> dict[str, str | int]:
        """The violation as recorded in evidence (without the timestamp)."""
        return {
            "operation": self.operation,
            "target": self.target,
            "capability": self.capability,
            "detail": self.detail,
            "session_id": self.session_id,
            "turn_number": self.turn_number,
        }


class DeclarationError(SandboxError, ValueError):
    """Raised when a turn's ``declared_outputs`` are missing or malformed (FR-RT-013).

    ``field`` names the offending entry (``declared_outputs[1].path``) and ``problem`` what is
    wrong. A well-formed declaration that is not *allowed* raises ``CapabilityViolation``.
    """

    def __init__(self, *, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class SandboxUnavailableError(SandboxError):
    """Raised when the configured enforcement level cannot be met on this machine.

    ``mechanisms`` maps each missing mechanism (``landlock``, ``netns``, ``cgroup_memory``,
    ``uid_drop`` ...) to why it is unavailable. With ``enforcement="strict"`` a turn never
    runs in that case; ``"best-effort"`` runs with what exists and records the levels.
    """

    def __init__(self, *, mechanisms: dict[str, str]) -> None:
        self.mechanisms = dict(mechanisms)
        what = "; ".join(f"{k}: {v}" for k, v in sorted(self.mechanisms.items()))
        super().__init__(f"sandbox enforcement unavailable: {what}")


class SpawnError(SandboxError, OSError):
    """Raised when the launcher could not start the turn's command (a setup step failed).

    ``stage`` is the failing step (``execve``, ``landlock``, ``chdir`` ...), ``errno_`` the
    OS error number.
    """

    def __init__(self, *, stage: str, errno_: int, message: str) -> None:
        self.stage = stage
        self.errno_ = errno_
        super().__init__(errno_, message)


class HelperError(SandboxError):
    """Raised by the sandbox helper's client when the helper refused a request (``kind`` as in
    `sandbox.helper.wire.Failed`: ``bad_request``, ``forbidden``, ``unknown_session``,
    ``promotion``, ``os``, ``unavailable``, ``internal``)."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"sandbox helper: {kind}: {message}")


class ConfinementLostError(SandboxError, OSError):
    """The process that confined a session's runs went away (the sandbox helper died or
    restarted): what the last run left in its areas is gone with it. An attempt it cut short
    is a CRASH, retried as the policy says."""


class SessionNotFoundError(SandboxError, LookupError):
    """Raised by ``Runtime.resume_session`` when the session's ledgers do not exist."""

    def __init__(self, *, session_id: str, tier: str) -> None:
        self.session_id = session_id
        self.tier = tier
        super().__init__(f"session {session_id!r} not found in tier {tier!r}")
