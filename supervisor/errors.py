"""Every exception the supervisor package raises on purpose, in one flat module.

Each says in its docstring when it is raised and carries structured fields (ids, codes, paths)
that logs and error answers record. The modules that raise them import them from here and
re-export some under their old names (``supervisor.turns.core.RequestError`` and so on), so
either import works. This module imports nothing from the rest of the package (cheap to import,
no cycles). Frame errors stay with the framing code (``supervisor.wire.frames.FrameError``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.policy.envelopes import ExecutorCommandType

__all__ = [
    "ClaimLostError",
    "ConfigError",
    "ConnectionLost",
    "ControlClientError",
    "DaemonAlreadyRunning",
    "DaemonNotRunning",
    "ExecutorRejected",
    "IntakeClosedError",
    "IntakeError",
    "LedgerForkError",
    "NotEscalatedError",
    "ProtocolError",
    "QueueFullError",
    "RequestError",
    "SchemaVersionError",
    "SessionClosedError",
    "StaleClaimError",
    "StoreError",
    "StoreIntegrityError",
    "StoreUnavailableError",
    "UnknownSessionError",
    "UnknownTurnError",
]


# -- configuration ------------------------------------------------------------------------------


class ConfigError(ValueError):
    """Raised when the configuration is invalid: an unknown key, a value of the wrong type or
    out of range, or a config file that cannot be read or is not valid TOML.

    `key` is the dotted key (`executors.heartbeat_interval_s`), or `"(file)"` for a problem with
    the file itself; `source` says where the value came from (the file path, the environment
    variable, `override`, or `default`); `line` is the TOML line number when known.
    """

    def __init__(
        self, key: str, problem: str, *, source: str | None = None, line: int | None = None
    ) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        self.line = line
        where = f" (from {source})" if source else ""
        super().__init__(f"config key {key!r}: {problem}{where}")


# -- the daemon ---------------------------------------------------------------------------------


class DaemonAlreadyRunning(Exception):
    """Raised by `hunter serve` when another daemon holds the root's lock file; ``root`` is the
    root, ``pid`` that daemon's pid (None when the lock file does not say)."""

    def __init__(self, root: Path, pid: int | None) -> None:
        self.root = root
        self.pid = pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"another daemon ({who}) already serves {root}; stop it first or use another --root"
        )


class RequestError(Exception):
    """Raised when a control request cannot be served; ``code`` is the stable wire error code.

    ``message`` says what was wrong, where, and what to do; ``details`` carries structured fields
    (for example ``retry_after_ms`` for ``queue_full`` or ``field`` for ``bad_request``).
    """

    def __init__(self, code: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, **self.details}


# -- the intake ---------------------------------------------------------------------------------


class StoreError(Exception):
    """Base class of the turn store's errors: raised when an operation of the store (the
    durable intake, turn states, ledger lines) cannot be carried out. Catch this for "the store
    said no"; the subclasses say why."""


#: The former name of `StoreError`, kept for code written against earlier releases (one more
#: release; it is the same class, so ``except IntakeError`` still catches every store error).
IntakeError = StoreError


class IntakeClosedError(StoreError):
    """Raised when an operation reaches an intake (or committer) that was already closed."""


class StoreIntegrityError(StoreError):
    """Raised when a row of the turn store is not what its columns promise (a bad state, a
    wrong type, unreadable JSON): written by something other than hunter, or damaged. It names
    the row; the daemon reports it and goes on."""

    def __init__(self, table: str, key: object, problem: str) -> None:
        self.table = table
        self.key = key
        self.problem = problem
        super().__init__(f"turn store row {table}[{key!r}] is invalid: {problem}")

    def __reduce__(self) -> tuple[type[StoreIntegrityError], tuple[str, object, str]]:
        return (type(self), (self.table, self.key, self.problem))


class StoreUnavailableError(StoreError):
    """Raised when the turn store's server cannot be reached for longer than a read waits
    (writes wait for it instead: they are never dropped)."""


class SchemaVersionError(StoreError):
    """Raised when a turn store was written with a schema this code cannot use: a newer
    version, an older one without a migration, or tables that are not a turn store.

    ``path`` names the store (a file, or a server and database), ``found`` its version (None
    when it is not a turn store), ``supported`` this code's version. Every engine raises it.
    """

    def __init__(self, path: Path | str, *, found: int | None, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        if found is None:
            what = (
                f"turn store {path} holds tables but no turn store schema version; it is not a"
                " turn store (perhaps the old intake file). Pass the path of a turn store, or a"
                " new file"
            )
        elif found > supported:
            what = (
                f"turn store {path} has schema version {found}, newer than the {supported} this"
                " hunter supports: a newer hunter wrote it. Upgrade hunter to open it, or use"
                " another state directory"
            )
        else:
            what = (
                f"turn store {path} has schema version {found} and this hunter ({supported}) has"
                " no migration from it. Open it with the hunter that wrote it and export the"
                " turns, or use another state directory"
            )
        super().__init__(what)


class UnknownSessionError(StoreError):
    """Raised when a session id is not in the intake (never opened, or a typo);
    ``session_id`` is the id asked for."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown session {session_id!r}")
        self.session_id = session_id


class UnknownTurnError(StoreError):
    """Raised when a turn id is not in the intake; ``turn_id`` is the id asked for."""

    def __init__(self, turn_id: int) -> None:
        super().__init__(f"unknown turn {turn_id}")
        self.turn_id = turn_id


class SessionClosedError(StoreError):
    """Raised when a turn is submitted to a session that is closed; ``session_id`` names it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} is closed; open a new session")
        self.session_id = session_id


class StaleClaimError(StoreError):
    """Raised when a write is made under a claim the daemon no longer holds: its lease expired
    and the turn was claimed again (a larger fencing token), or the turn was released or ended.
    Nothing was written; the late result must be dropped (and logged), never recorded.

    ``turn_id``, ``token`` (the claim's) and ``current_token`` (the store's) say which.
    """

    def __init__(self, turn_id: int, *, token: int, current_token: int, owner: str) -> None:
        super().__init__(
            f"turn {turn_id}: the claim of {owner} (token {token}) is stale; the turn's token"
            f" is now {current_token}, so this write was refused"
        )
        self.turn_id = turn_id
        self.token = token
        self.current_token = current_token
        self.owner = owner


class LedgerForkError(StoreError, ValueError):
    """Raised by the store when a ledger line does not continue the chain it keeps: a different
    line is kept at its seq, or its previous hash is not its predecessor's. Nothing of the
    write was kept. In a fleet it means this daemon's copy of the session's chain is stale
    (another daemon appended while it was away): the session is rebuilt from the store.

    ``ledger_id`` and ``seq`` name the line.
    """

    def __init__(self, ledger_id: str, seq: int, detail: str) -> None:
        super().__init__(f"ledger {ledger_id} {detail} at seq {seq}")
        self.ledger_id = ledger_id
        self.seq = seq


class ClaimLostError(StaleClaimError):
    """Raised by the daemon itself (not the store) when a turn would start an attempt, or end,
    after this daemon lost its claim: a renewal round found it taken over, or the session's
    home moved (in a fleet, after a pause past the lease). Nothing is written or started; the
    late result is dropped and logged once (``stale_result_refused``), never recorded.

    ``turn_id`` and ``reason`` say which and why.
    """

    def __init__(self, turn_id: int, *, reason: str) -> None:
        StoreError.__init__(self, f"turn {turn_id}: {reason}; nothing of it was recorded here")
        self.turn_id = turn_id
        self.token = -1
        self.current_token = -1
        self.owner = ""
        self.reason = reason


class NotEscalatedError(StoreError):
    """Raised when an escalation is resolved for a turn that is not parked (``state`` says
    where it is)."""

    def __init__(self, turn_id: int, state: str) -> None:
        super().__init__(f"turn {turn_id} is {state}, not escalated")
        self.turn_id = turn_id
        self.state = state


# -- executors ----------------------------------------------------------------------------------


class ProtocolError(Exception):
    """Raised when a well-framed executor message breaks the protocol (wrong type, missing
    field...).

    ``reason_code`` is one of ``supervisor.wire.executor.RejectReason``; ``reason`` is a
    human-readable explanation that names the offending field.
    """

    def __init__(self, reason_code: str, reason: str) -> None:
        self.reason_code = reason_code
        self.reason = reason
        super().__init__(f"{reason_code}: {reason}")


class QueueFullError(Exception):
    """Raised by ``ExecutorHub.admit`` when a command type's queue holds ``capacity`` attempts.

    ``command_type`` is the full queue's command; ``retry_after_ms`` is a hint: roughly how long
    until the queue has room again.
    """

    def __init__(self, command_type: ExecutorCommandType, capacity: int, retry_after_ms: int):
        self.command_type = command_type
        self.capacity = capacity
        self.retry_after_ms = retry_after_ms
        super().__init__(
            f"the {command_type.value} queue is full ({capacity} waiting); "
            f"retry after {retry_after_ms} ms"
        )


class ExecutorRejected(Exception):
    """Raised by the SDK's ``run_executor`` when the daemon refused the hello and retrying cannot
    help (unsupported version, bad hello, uid not allowed), or when ``reconnect=False``.

    ``reason_code`` is the reject's code, ``reason`` its text, ``retry_after_ms`` its hint.
    """

    def __init__(self, reason_code: str, reason: str, retry_after_ms: int | None = None) -> None:
        self.reason_code = reason_code
        self.reason = reason
        self.retry_after_ms = retry_after_ms
        super().__init__(f"{reason_code}: {reason}")


# -- the control client -------------------------------------------------------------------------


class DaemonNotRunning(Exception):
    """Raised by the control client when nothing answers on the control socket (missing file,
    refused connection); ``socket_path`` is the socket tried, ``reason`` what happened."""

    def __init__(self, socket_path: Path, reason: str) -> None:
        self.socket_path = socket_path
        self.reason = reason
        super().__init__(
            f"no daemon at {socket_path} ({reason}). Start one with `hunter serve --root DIR` "
            "(same root), or pass the control socket with `--socket PATH`"
        )


class ControlClientError(Exception):
    """Raised by the control client when the daemon answers a request with an error; ``op`` is
    the operation, ``code``/``message``/``details`` come from the wire."""

    def __init__(self, op: str, error: dict[str, Any]) -> None:
        self.op = op
        self.code = str(error.get("code", "unknown"))
        self.message = str(error.get("message", ""))
        self.details = {k: v for k, v in error.items() if k not in {"code", "message"}}
        super().__init__(f"{op}: {self.code}: {self.message}")


class ConnectionLost(Exception):
    """Raised by the control client to callers still waiting when the daemon closes the
    connection."""
