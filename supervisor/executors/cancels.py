"""What a connection keeps of the attempts it no longer waits for: ``Cancels``.

An attempt leaves a connection's in-flight table in one of two ways: it is answered (judged),
or it is cancelled — its deadline passed, its turn's task was cancelled, or the attempt was
abandoned. A cancelled attempt still takes its executor slot until the executor answers the
``cancel`` it is sent; if that answer does not come within ``cancel_grace_s`` after a deadline,
the executor is marked ERROR until it answers. ``Cancels`` holds those unanswered cancels and
the ids that ended recently, and attributes a response that names no in-flight attempt: a late
one (logged ``late_response_dropped``), one while nothing is in flight (ignored), one among
several in flight (none can be judged: the connection closes), or, with exactly one in flight,
that one's answer (see ``connection``).

It is apart from ``connection`` because it changes for other reasons (the cancel protocol, the
rules for late answers) and runs off the hot path: only a deadline passed, a cancelled turn or
a stray answer reach it. The connection reads ``unanswered`` (its load) and appends to
``recent`` (every judged answer) through references it binds once, so a turn's path costs no
extra hop. What it needs of its connection is ``CancelsOwner``.
"""

from __future__ import annotations

import collections
from typing import Final, Generic, Protocol, TypeVar

import anyio

from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from supervisor.executors.host import ConnectionHost
from supervisor.executors.judge import Verdict, unattributable
from supervisor.executors.log import EventLog
from supervisor.executors.pending import Pending
from supervisor.executors.reports import HubReason
from supervisor.wire.executor import Cancel
from supervisor.wire.frames import FrameWriter, encode_frame

__all__ = ["RECENT_IDS", "Cancels", "CancelsOwner"]

RECENT_IDS: Final = 64  # finished instruction ids remembered per connection (late answers)

_LOST: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class CancelsOwner(Protocol):
    """What ``Cancels`` needs of the connection it belongs to."""

    @property
    def executor_id(self) -> str:
        """The executor's id (every event names it)."""

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (nothing is sent or held any more)."""

    def disconnect(self, reason: str, detail: str) -> None:
        """Close the connection (a cancel could not be sent)."""

    def fail_in_flight(self, verdict: Verdict) -> None:
        """End what is in flight with *verdict* (an answer that cannot be attributed)."""

    def fault(self, detail: str) -> None:
        """A cancel went unanswered: the executor is ERROR (with *detail*) until it answers."""

    def recover(self) -> None:
        """Every cancel is answered: the executor is no longer ERROR."""


#: the connection a ``Cancels`` belongs to (and its host is told about)
_Owner = TypeVar("_Owner", bound=CancelsOwner)


class Cancels(Generic[_Owner]):
    """One connection's unanswered cancels and recently ended instruction ids."""

    __slots__ = ("_host", "_log", "_owner", "_writer", "recent", "unanswered")

    def __init__(
        self, *, owner: _Owner, host: ConnectionHost[_Owner], writer: FrameWriter, log: EventLog
    ) -> None:
        self._owner = owner
        self._host = host
        self._writer = writer
        self._log = log
        #: cancelled attempts whose answer (the ack of the cancel) has not come; each keeps its
        #: slot taken. Only this class changes it; the connection reads it for its load.
        self.unanswered: dict[str, Pending] = {}
        #: ids of attempts that ended recently: a second answer to one of them is late
        self.recent: collections.deque[str] = collections.deque(maxlen=RECENT_IDS)

    def hold(self, pending: Pending) -> None:
        """*pending* was taken out of the in-flight table and is cancelled: its slot stays
        taken until the executor answers (the caller sends the cancel and recounts)."""
        self.unanswered[pending.envelope.instruction_id] = pending

    async def cancel(self, pending: Pending, reason: str) -> None:
        """Send the ``cancel`` of *pending*, within ``cancel_grace_s`` and shielded (its turn
        is being cancelled: the executor is told anyway, so its answer frees the slot)."""
        with anyio.move_on_after(self._host.settings.cancel_grace_s, shield=True):
            await self._send(pending.envelope, reason=reason)

    async def after_deadline(self, pending: Pending, answered: anyio.Event) -> None:
        """*pending*'s deadline passed (it is resolved and out of the in-flight table): send
        its ``cancel`` and wait ``cancel_grace_s`` for *answered*; without an answer, the
        executor is ERROR until it answers."""
        envelope = pending.envelope
        iid = envelope.instruction_id
        owner = self._owner
        self.unanswered[iid] = pending  # its slot stays taken until the cancel is answered
        self._host.recount(owner)
        grace = self._host.settings.cancel_grace_s
        with anyio.move_on_after(grace):
            await self._send(envelope, reason="deadline")
            await answered.wait()
        if self.unanswered.get(iid) is pending and not owner.closed:
            detail = f"did not answer the cancel of {iid} within cancel_grace_s={grace:g}s"
            self._log.warning(
                "executor_error",
                executor_id=owner.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                detail=detail,
            )
            owner.fault(detail)

    def stray(self, iid: object, in_flight: int) -> bool:
        """A response names *iid*, which is not in flight (*in_flight*: how many are): whether
        it is dealt with here — a late answer (dropped), an answer while nothing is in flight
        (ignored), or one that cannot be attributed among several (they all end
        INVALID_RESPONSE and the connection closes). False with exactly one in flight: the
        caller judges it as that one's answer (which the safety rules then deny)."""
        if isinstance(iid, str) and self._late(iid):
            return True
        owner = self._owner
        if in_flight == 0:
            self._log.warning(
                "response_rejected",
                executor_id=owner.executor_id,
                instruction_id=str(iid)[:128] if iid is not None else None,
                reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                detail="response while no instruction is in flight",
            )
            return True
        if in_flight > 1:
            verdict = unattributable(iid, in_flight)
            self._log.warning(
                "response_rejected",
                executor_id=owner.executor_id,
                reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                detail=verdict.detail,
            )
            owner.fail_in_flight(verdict)
            owner.disconnect(HubReason.UNATTRIBUTABLE_RESPONSE, verdict.detail)
            return True
        return False

    def _late(self, iid: str) -> bool:
        """If *iid* names the answer to a cancel or a second answer to an attempt that ended,
        drop it (logged) and say so."""
        pending = self.unanswered.pop(iid, None)
        if pending is not None:
            self._answered(pending)
            return True
        if iid in self.recent:
            self._host.late_response()
            self._log.warning(
                "late_response_dropped",
                executor_id=self._owner.executor_id,
                instruction_id=iid,
                after_cancel=False,
                detail="a second answer to an instruction that already ended",
            )
            return True
        return False

    def release(self) -> None:
        """The connection closed: wake whoever waits for an answer, and forget them all."""
        for pending in list(self.unanswered.values()):
            if pending.event is not None:
                pending.event.set()
        self.unanswered.clear()

    def _answered(self, pending: Pending) -> None:
        """The answer to a cancelled attempt came: its slot is free again."""
        owner = self._owner
        self._host.late_response()
        iid = pending.envelope.instruction_id
        self.recent.append(iid)
        self._log.warning(
            "late_response_dropped",
            executor_id=owner.executor_id,
            instruction_id=iid,
            execution_id=pending.envelope.execution_id,
            after_cancel=True,
        )
        if pending.event is not None:
            pending.event.set()
        if not self.unanswered:
            owner.recover()
        self._host.recount(owner)
        self._host.slot_freed(owner)

    async def _send(self, envelope: ExecutorInstructionEnvelope, *, reason: str) -> None:
        iid = envelope.instruction_id
        owner = self._owner
        try:
            await self._writer.send(
                encode_frame(Cancel(instruction_id=iid, reason=reason).to_wire())
            )
        except _LOST as exc:
            owner.disconnect(HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
        else:
            self._log.info(
                "cancel_sent",
                executor_id=owner.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                reason=reason,
            )
