"""The group committer both engines share: the queue of writes, the store's lifetime states,
and the loop that takes what is queued as one batch.

Callers' writes (`supervisor.store.queued.QueuedOp`) go onto a memory object stream; one task
(`Committer.run`) takes everything queued (up to ``max_batch``), skips the ops whose callers
gave up before the batch began, and hands the rest to the engine's `BatchRunner`, which runs
them in one transaction. The committer then sets each op's outcome: a batch that failed as a
whole fails each of its ops with that error; one that committed counts towards `statistics`.
A batch that reached the database finishes even when the loop is cancelled (it is shielded),
so no caller is left not knowing whether its write happened.

Apart from the engines because it is the same for both: what differs is only how a batch
runs (SQLite: on the loop or its commit thread; PostgreSQL: on the writer connection, again
after a lost connection or a deadlock), which each engine's runner keeps.

The lifetime: ``new -> starting -> open -> closing -> closed``. `submit` and `check_open`
refuse a store that is not open: a programming error (`RuntimeError`) before `run` started,
`IntakeClosedError` once it is closing or closed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

import anyio
import anyio.lowlevel

from supervisor.errors import IntakeClosedError, StaleClaimError
from supervisor.store.queued import QueuedOp

__all__ = ["BatchRunner", "Committer", "State"]

OpT = TypeVar("OpT", bound=QueuedOp[object])

#: Where a store is in its lifetime.
State = Literal["new", "starting", "open", "closing", "closed"]


class BatchRunner(Protocol[OpT]):
    """How an engine runs one batch: all of it in one transaction, each op all-or-nothing
    (an op's own error kept on the op); raises when the transaction failed as a whole."""

    #: whether the committer yields to the event loop once the batch's callers are told (the
    #: batch ran on the loop without waiting: let what arrived meanwhile be served)
    @property
    def checkpoint_after(self) -> bool: ...

    async def run_batch(self, batch: list[OpT]) -> None: ...


class Committer(Generic[OpT]):
    """The queue of an engine's writes and the task that commits them in batches.

    *where* names the store in messages; *opener* is the context manager that runs it (named
    when the store is used before `run`); *landed*, when given, is told of every op the
    committer is done with (committed, failed or skipped).
    """

    def __init__(
        self,
        runner: BatchRunner[OpT],
        *,
        where: str,
        opener: str,
        max_batch: int,
        landed: Callable[[OpT], None] | None = None,
    ) -> None:
        self._runner = runner
        self._where = where
        self._opener = opener
        self._max_batch = max_batch
        self._landed = landed
        self._send, self._receive = anyio.create_memory_object_stream[OpT](math.inf)
        self.state: State = "new"
        self._stopped = anyio.Event()
        #: transactions committed, the ops in them, the largest batch, the stale writes refused
        self.commits = 0
        self.operations = 0
        self.largest = 0
        self.stale = 0

    # -- lifetime -------------------------------------------------------------------------

    def begin(self) -> None:
        """`run` starts (its connections are being opened)."""
        if self.state != "new":
            raise RuntimeError(f"turn store {self._where}: run() was already called")
        self.state = "starting"

    def opened(self) -> None:
        """The connections are open: writes are taken (unless it was closed meanwhile)."""
        if self.state == "starting":
            self.state = "open"

    def stop(self) -> None:
        """The commit loop ended: refuse new writes, fail those still queued."""
        self.state = "closed"
        self._send.close()
        for op in self._drain():
            op.fail(IntakeClosedError(f"turn store {self._where} stopped"))
            op.complete()

    def shut(self) -> None:
        """Closed for good (the connections too): `aclose` returns."""
        self.state = "closed"
        self._send.close()
        self._receive.close()
        self._stopped.set()

    async def aclose(self) -> None:
        """Let the queued writes commit and the loop end; at once when it never ran."""
        if self.state in {"new", "closed"}:
            self.shut()
            return
        self.state = "closing"
        self._send.close()  # the commit loop drains the stream, then ends
        await self._stopped.wait()

    def check_open(self) -> None:
        if self.state == "open":
            return
        self._refuse()

    def _refuse(self) -> None:
        if self.state in {"new", "starting"}:
            raise RuntimeError(
                f"turn store {self._where} is not running: start its run() in a task group or"
                f" use {self._opener}()"
            )
        raise IntakeClosedError(f"turn store {self._where} is closed")

    def _drain(self) -> list[OpT]:
        left: list[OpT] = []
        while True:
            try:
                left.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return left

    # -- the queue and the loop -----------------------------------------------------------

    def submit(self, op: OpT) -> None:
        """Queue *op* for the next batch."""
        if self.state != "open":
            self._refuse()
        try:
            self._send.send_nowait(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise IntakeClosedError(f"turn store {self._where} is closed") from None

    async def run(self) -> None:
        """Commit batches until the stream is closed (`aclose`) or the task is cancelled."""
        runner = self._runner
        landed = self._landed
        async for first in self._receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            live = [op for op in batch if not op.abandoned]
            if landed is not None:
                for op in batch:
                    if op.abandoned:
                        landed(op)
            if not live:
                continue
            # Shielded: a batch that reached the database finishes and its callers learn the
            # outcome.
            with anyio.CancelScope(shield=True):
                try:
                    await runner.run_batch(live)
                except Exception as exc:  # the transaction failed: nothing of it was written
                    for op in live:
                        op.fail(exc)
                else:
                    self.commits += 1
                    self.operations += len(live)
                    self.largest = max(self.largest, len(live))
                    self.stale += sum(isinstance(op.error, StaleClaimError) for op in live)
                finally:
                    for op in live:
                        if landed is not None:
                            landed(op)
                        op.complete()
                        op.committed()
                if runner.checkpoint_after:
                    await anyio.lowlevel.checkpoint()  # let the loop serve what arrived meanwhile
