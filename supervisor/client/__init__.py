"""The HUMANOID HUNTER client library: the daemon's control API as typed, awaitable calls.

::

    from supervisor.client import connect

    async with connect(root="/var/lib/hunter") as client:
        session = await client.open_session("demo")
        handle = await client.submit_instruction(session.session_id, "READ", selector="h1")
        turn = await handle.result()

`Client` is async (anyio); `SyncClient` wraps it for scripts. Results are frozen values
(`Turn`, `Session`, `Executor`, `DecisionRecord`, `DecidedBy`, `LedgerCheck`, `Event`; the
answers' ``to_dict()`` gives them back as the daemon's JSON); refusals are exceptions named
after the protocol's error codes (`UnknownTurn`, `QueueFull`, `IdempotencyConflict`, ...:
`supervisor.client.errors`). docs/client.md has runnable examples.

This import path is stable. The first release's ``supervisor.client`` was the raw connection:
`ControlClient`, `ControlClientError`, `DaemonNotRunning` and `socket_for_root` are still here
(and in ``supervisor.control.client``), so code written against it keeps working.
"""

from supervisor.client.client import Client, Completion, Events, TurnHandle, connect, find_socket
from supervisor.client.errors import (
    BadManifest,
    BadRequest,
    Busy,
    CapabilityViolation,
    ConnectionLost,
    DaemonNotRunning,
    DeclarationError,
    Draining,
    HunterError,
    IdempotencyConflict,
    InternalError,
    InvalidInstruction,
    LedgerInvalid,
    NoEvidence,
    NotCancellable,
    NotEscalated,
    QueueFull,
    ReplyTooLarge,
    SandboxUnavailable,
    SessionBusy,
    SessionClosed,
    SessionOpenFailed,
    SessionUnavailable,
    StoreIntegrity,
    SubscriberTooSlow,
    TurnRejected,
    UnknownOperation,
    UnknownPackage,
    UnknownSession,
    UnknownTurn,
    WaitTimeout,
)
from supervisor.client.models import (
    Attempt,
    DecidedBy,
    DecisionRecord,
    EvidenceSlice,
    Executor,
    ExecutorPage,
    LedgerCheck,
    LedgerEntry,
    Session,
    SessionInfo,
    Turn,
    TurnPage,
)
from supervisor.client.sync import SyncClient
from supervisor.control.client import ControlClient, socket_for_root
from supervisor.errors import ControlClientError
from supervisor.feed import Event
from supervisor.wire.turn_spec import RequestedBy

__all__ = [
    "Attempt",
    "BadManifest",
    "BadRequest",
    "Busy",
    "CapabilityViolation",
    "Client",
    "Completion",
    "ConnectionLost",
    "ControlClient",
    "ControlClientError",
    "DaemonNotRunning",
    "DecidedBy",
    "DecisionRecord",
    "DeclarationError",
    "Draining",
    "Event",
    "Events",
    "EvidenceSlice",
    "Executor",
    "ExecutorPage",
    "HunterError",
    "IdempotencyConflict",
    "InternalError",
    "InvalidInstruction",
    "LedgerCheck",
    "LedgerEntry",
    "LedgerInvalid",
    "NoEvidence",
    "NotCancellable",
    "NotEscalated",
    "QueueFull",
    "ReplyTooLarge",
    "RequestedBy",
    "SandboxUnavailable",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionInfo",
    "SessionOpenFailed",
    "SessionUnavailable",
    "StoreIntegrity",
    "SubscriberTooSlow",
    "SyncClient",
    "Turn",
    "TurnHandle",
    "TurnPage",
    "TurnRejected",
    "UnknownOperation",
    "UnknownPackage",
    "UnknownSession",
    "UnknownTurn",
    "WaitTimeout",
    "connect",
    "find_socket",
    "socket_for_root",
]
