"""The client library's exceptions: one per error code of the control protocol
(docs/control-protocol.md section 7), all `HunterError`s.

`HunterError` is a `supervisor.errors.ControlClientError`, so code written against the older
client (``except ControlClientError``) catches these too. ``code``, ``message`` and
``details`` (the error's other fields: ``field``, ``retry_after_ms``, ``turn_id``, ...) come
from the daemon's answer; `error_for` picks the class by code (an unknown code: `HunterError`).
"""

from __future__ import annotations

from typing import Any, Final

from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning

__all__ = [
    "BadManifest",
    "BadRequest",
    "Busy",
    "CapabilityViolation",
    "ConnectionLost",
    "DaemonNotRunning",
    "DeclarationError",
    "Draining",
    "HunterError",
    "IdempotencyConflict",
    "InternalError",
    "InvalidInstruction",
    "LedgerInvalid",
    "NoEvidence",
    "NotCancellable",
    "NotEscalated",
    "QueueFull",
    "ReplyTooLarge",
    "SandboxUnavailable",
    "SessionBusy",
    "SessionClosed",
    "SessionOpenFailed",
    "SessionUnavailable",
    "StoreIntegrity",
    "SubscriberTooSlow",
    "TurnRejected",
    "UnknownOperation",
    "UnknownPackage",
    "UnknownSession",
    "UnknownTurn",
    "WaitTimeout",
    "error_for",
]


class HunterError(ControlClientError):
    """The daemon refused a request; ``code`` is the protocol's stable error code."""

    def __init__(self, op: str, error: dict[str, Any]) -> None:
        super().__init__(op, error)

    @property
    def retry_after_ms(self) -> int | None:
        """When the daemon says to try again later (``queue_full``, ``busy``): how much later."""
        value = self.details.get("retry_after_ms")
        return int(value) if isinstance(value, int | float) else None


class BadRequest(HunterError):
    """A parameter is missing or has the wrong type or value (``field`` says which)."""


class UnknownOperation(HunterError):
    """The daemon does not know the operation (an older daemon?)."""


class UnknownSession(HunterError):
    """No session with that id."""


class UnknownTurn(HunterError):
    """No turn with that id."""


class UnknownPackage(HunterError):
    """The package is not installed in the daemon's root."""


class BadManifest(HunterError):
    """The package's manifest is invalid."""


class SessionClosed(HunterError):
    """The session is closed; open a new one."""


class SessionBusy(HunterError):
    """The session still has unfinished turns."""


class SessionUnavailable(HunterError):
    """The session is not loaded in this daemon."""


class SessionOpenFailed(HunterError):
    """The sandbox runtime could not open the session."""


class InvalidInstruction(HunterError):
    """The instruction breaks a Phase-20 rule (``field``, ``reason_code``)."""


class DeclarationError(HunterError):
    """Declared outputs or inputs are missing or invalid."""


class CapabilityViolation(HunterError):
    """The request breaks the package's capabilities (recorded in the evidence ledger)."""


class SandboxUnavailable(HunterError):
    """Strict enforcement is on and a confinement mechanism is missing."""


class TurnRejected(HunterError):
    """The sandbox runtime refused the turn."""


class QueueFull(HunterError):
    """Backpressure: retry after ``retry_after_ms``."""


class Draining(HunterError):
    """The daemon is shutting down and accepts no new work."""


class IdempotencyConflict(HunterError):
    """The idempotency key already names a turn submitted with another payload (``fields``)."""


class NotCancellable(HunterError):
    """The turn is not active any more."""


class NotEscalated(HunterError):
    """The turn is not parked for an operator."""


class NoEvidence(HunterError):
    """The turn has no stored evidence bytes (its executor sent only their hash, or none)."""


class LedgerInvalid(HunterError):
    """A ledger failed verification."""


class WaitTimeout(HunterError):
    """What was awaited did not happen in time."""


class ReplyTooLarge(HunterError):
    """The answer is over the frame limit: ask for less."""


class Busy(HunterError):
    """The connection has too many requests in progress: retry after ``retry_after_ms``."""


class SubscriberTooSlow(HunterError):
    """An event subscription was cut off: subscribe again after ``resume_after``."""


class StoreIntegrity(HunterError):
    """A stored row is damaged or foreign (the daemon's log names it)."""


class InternalError(HunterError):
    """A bug in the daemon (its log has the traceback)."""


#: The class of each error code.
ERRORS: Final[dict[str, type[HunterError]]] = {
    "bad_request": BadRequest,
    "unknown_op": UnknownOperation,
    "unknown_session": UnknownSession,
    "unknown_turn": UnknownTurn,
    "unknown_package": UnknownPackage,
    "bad_manifest": BadManifest,
    "session_closed": SessionClosed,
    "session_busy": SessionBusy,
    "session_unavailable": SessionUnavailable,
    "session_open_failed": SessionOpenFailed,
    "invalid_instruction": InvalidInstruction,
    "declaration_error": DeclarationError,
    "capability_violation": CapabilityViolation,
    "sandbox_unavailable": SandboxUnavailable,
    "turn_rejected": TurnRejected,
    "queue_full": QueueFull,
    "draining": Draining,
    "idempotency_conflict": IdempotencyConflict,
    "not_cancellable": NotCancellable,
    "not_escalated": NotEscalated,
    "no_evidence": NoEvidence,
    "ledger_invalid": LedgerInvalid,
    "timeout": WaitTimeout,
    "reply_too_large": ReplyTooLarge,
    "busy": Busy,
    "subscriber_too_slow": SubscriberTooSlow,
    "store_integrity": StoreIntegrity,
    "internal": InternalError,
}


def error_for(error: ControlClientError) -> HunterError:
    """The typed exception for an error answer the connection raised."""
    if isinstance(error, HunterError):
        return error
    wire = {"code": error.code, "message": error.message, **error.details}
    return ERRORS.get(error.code, HunterError)(error.op, wire)
