"""The ``Executor`` base class and the ``Result`` a handler returns.

Subclass ``Executor`` and override the handlers of the commands you support; the SDK advertises
exactly the overridden ones in ``hello``::

    class Reader(Executor):
        async def read(self, instruction: Instruction) -> Result:
            text = await fetch(instruction.target_selector)
            return Result.success(text.encode(), output={"text": text})

A handler that raises ends the instruction with an ERROR response (a CRASH fault for the
daemon); raising ``NotSupported`` gives REFUSED. A ``cancel`` from the daemon cancels the
handler's cancel scope, and the SDK answers TIMEOUT. Evidence is hashed for you:
``Result.success(evidence_bytes)`` sends only ``sha256(evidence_bytes)`` as ``evidence_hash``
(the turn records the hash; the daemon keeps no bytes). ``attach_evidence=True`` also sends the
bytes themselves beside the response (at most ``MAX_EVIDENCE_BYTES``); the daemon checks them
against the hash and keeps them with the session, at the cost of a durable file write per turn
(docs/protocol.md, "Evidence bytes").
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorResponseType,
)
from supervisor.wire.executor import MAX_EVIDENCE_BYTES, MAX_RETRY_AFTER_MS

if TYPE_CHECKING:
    from supervisor.wire.executor import Status, Welcome

__all__ = [
    "Executor",
    "Instruction",
    "LiveConnection",
    "NotSupported",
    "Result",
    "sha256_hex",
    "utc_timestamp",
]


class LiveConnection(Protocol):
    """What a handler may use of its executor's live connection (``Executor.connection``;
    `supervisor.sdk.connection.Connection`, which imports this module)."""

    @property
    def welcome(self) -> Welcome | None:
        """The daemon's welcome (its limits), once the handshake is done."""
        ...

    @property
    def running(self) -> frozenset[str]:
        """Ids of the instructions taken and not yet answered."""
        ...

    async def send_message(self, message: Mapping[str, object]) -> None:
        """Send one protocol message as a frame."""
        ...

    async def send_raw(self, data: bytes, *, cork: bool | None = None) -> None:
        """Send raw bytes (test executors use it to send broken frames)."""
        ...

    async def send_status(self, status: Status) -> None:
        """Tell the daemon whether this executor takes new work."""
        ...

    async def flush(self) -> None:
        """Send what is queued now."""
        ...


#: What handlers receive: the validated, frozen Phase-20 instruction envelope.
Instruction = ExecutorInstructionEnvelope


def sha256_hex(data: bytes | str) -> str:
    """Lowercase hex sha256 of ``data`` (str is UTF-8 encoded): the evidence hash format."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


#: (second, its "YYYY-MM-DDTHH:MM:SS" text): one assignment, so threads never see half of it
_second_text: tuple[int, str] = (-1, "")


def utc_timestamp() -> str:
    """Now, as an ISO 8601 UTC timestamp with microseconds (the responses' ``timestamp``,
    ``2026-01-01T00:00:00.000001Z``); the text of the current second is made once a second."""
    global _second_text
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)
    cached, text = _second_text
    if cached != second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_text = (second, text)
    return f"{text}.{micro:06d}Z"


class NotSupported(Exception):
    """Raised by a handler (or the default handlers) for a command the executor does not do.

    The SDK answers REFUSED with ``reason`` as the error message.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _empty() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Result:
    """A handler's answer; the SDK turns it into the ``response`` message."""

    response_type: ExecutorResponseType
    evidence_hash: str = ""
    error_message: str = ""
    output: Mapping[str, object] = field(default_factory=_empty)
    partial: bool = False
    #: the evidence bytes sent beside the response (None: only the hash is sent)
    evidence: bytes | None = None
    #: FAILURE/ERROR: how long the daemon should wait before a retry (None: its own backoff)
    retry_after_ms: int | None = None

    def __post_init__(self) -> None:
        after = self.retry_after_ms
        if after is not None and (type(after) is not int or not 0 <= after <= MAX_RETRY_AFTER_MS):
            msg = f"retry_after_ms must be an int in 0..{MAX_RETRY_AFTER_MS}, got {after!r}"
            raise ValueError(msg)

    @classmethod
    def success(
        cls,
        evidence: bytes | str,
        *,
        output: Mapping[str, object] | None = None,
        partial: bool = False,
        attach_evidence: bool = False,
    ) -> Result:
        """SUCCESS with ``evidence_hash = sha256(evidence)`` and, with *attach_evidence*, the
        evidence bytes themselves (str is UTF-8 encoded), which the daemon checks and keeps
        content-addressed with the session. Off by default: a turn whose evidence the daemon
        keeps costs it a durable file write (two fsyncs today). ``partial`` marks incomplete
        output (the daemon treats it as a PARTIAL fault). Raises ``ValueError`` for attached
        evidence over ``MAX_EVIDENCE_BYTES``."""
        data = evidence.encode() if isinstance(evidence, str) else bytes(evidence)
        if attach_evidence and len(data) > MAX_EVIDENCE_BYTES:
            msg = (
                f"evidence of {len(data)} bytes exceeds MAX_EVIDENCE_BYTES={MAX_EVIDENCE_BYTES}"
                " (pass attach_evidence=False to send only its hash)"
            )
            raise ValueError(msg)
        return cls(
            ExecutorResponseType.SUCCESS,
            evidence_hash=sha256_hex(data),
            output=output or {},
            partial=partial,
            evidence=data if attach_evidence else None,
        )

    @classmethod
    def failure(
        cls,
        message: str,
        *,
        output: Mapping[str, object] | None = None,
        retry_after_ms: int | None = None,
    ) -> Result:
        """FAILURE: the action was tried and did not work (e.g. selector matched nothing).
        *retry_after_ms*: wait this long before a retry (e.g. a site's ``Retry-After``); the
        daemon honours it up to its ``[retry] max_delay_ms``. Raises ``ValueError`` when it is
        not an int in 0..``MAX_RETRY_AFTER_MS``."""
        return cls(
            ExecutorResponseType.FAILURE,
            error_message=message,
            output=output or {},
            retry_after_ms=retry_after_ms,
        )

    @classmethod
    def error(cls, message: str, *, retry_after_ms: int | None = None) -> Result:
        """ERROR: the executor itself broke (the daemon treats it as a CRASH fault);
        *retry_after_ms* as for `failure`."""
        return cls(ExecutorResponseType.ERROR, error_message=message, retry_after_ms=retry_after_ms)

    @classmethod
    def refused(cls, message: str) -> Result:
        """REFUSED: the executor will not do this (never retried)."""
        return cls(ExecutorResponseType.REFUSED, error_message=message)

    @classmethod
    def timeout(cls, message: str) -> Result:
        """TIMEOUT: the action ran out of time (also the answer to a ``cancel``)."""
        return cls(ExecutorResponseType.TIMEOUT, error_message=message)

    def to_wire(self, instruction_id: str) -> dict[str, object]:
        """The ``response`` object of the protocol for ``instruction_id``."""
        wire: dict[str, object] = {
            "instruction_id": instruction_id,
            "response_type": self.response_type.value,
            "evidence_hash": self.evidence_hash,
            "error_message": self.error_message,
            "timestamp": utc_timestamp(),
            "output": dict(self.output),
            "partial": self.partial,
        }
        if self.retry_after_ms is not None:
            wire["retry_after_ms"] = self.retry_after_ms
        return wire


_HANDLERS: dict[ExecutorCommandType, str] = {c: c.value.lower() for c in ExecutorCommandType}


class Executor:
    """Base class of an executor: override one async handler per supported command.

    ``executor_id`` must be unique among the daemon's connected executors; ``slots`` is how many
    instructions it runs at once. A handler may also return a plain mapping, which is sent as
    the response object verbatim (for test executors that must be able to lie).
    """

    software: ClassVar[str] = "hunter-python-sdk/1"

    def __init__(self, *, executor_id: str, slots: int = 1) -> None:
        self.executor_id = executor_id
        self.slots = slots
        self.connection: LiveConnection | None = None
        self.stop_requested = False

    # -- handlers (override the ones you support) --------------------------------------------
    async def navigate(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("NAVIGATE is not supported by this executor")

    async def click(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("CLICK is not supported by this executor")

    async def read(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("READ is not supported by this executor")

    async def scroll(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("SCROLL is not supported by this executor")

    async def screenshot(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("SCREENSHOT is not supported by this executor")

    async def extract(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        raise NotSupported("EXTRACT is not supported by this executor")

    async def shutdown(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        """Default SHUTDOWN (only advertised when overridden): acknowledge and stop."""
        self.stop_requested = True
        return Result.success(f"SHUTDOWN {instruction.instruction_id}")

    # -- hooks ---------------------------------------------------------------------------------
    async def on_connected(self, welcome: Welcome) -> None:
        """Called after each successful hello (also after a reconnect)."""

    async def on_disconnected(self, reason: str) -> None:
        """Called when a connection ends, before any reconnect."""

    # -- machinery -----------------------------------------------------------------------------
    def commands(self) -> tuple[ExecutorCommandType, ...]:
        """The command types whose handler this class overrides (what ``hello`` advertises)."""
        cls = type(self)
        return tuple(
            command
            for command, name in _HANDLERS.items()
            if getattr(cls, name) is not getattr(Executor, name)
        )

    async def handle(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        """Dispatch ``instruction`` to its handler."""
        handler = getattr(self, _HANDLERS[instruction.command_type])
        result: Result | Mapping[str, Any] = await handler(instruction)
        return result
