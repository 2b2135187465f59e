"""A write queued for an engine's group commit, and the `PendingWrite` its caller waits on.

Both engines queue their writes the same way: the caller puts an op on the committer's stream
and waits on its event; the committer runs a batch of ops in one transaction and sets each op's
outcome. What differs is how an op runs (SQLite: a plain call on the commit thread or the
loop; PostgreSQL: a coroutine on the writer connection), so each engine's op class adds only
its own ``execute``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio

from supervisor.errors import IntakeClosedError
from supervisor.logging import get_logger
from supervisor.store.grouping import Accept, Finish
from supervisor.store.sealing import LineSeal, withdraw_all

__all__ = ["PendingOp", "QueuedOp", "withdraw_batch"]

T_co = TypeVar("T_co", covariant=True)

_log = get_logger("supervisor.store")


class QueuedOp(Generic[T_co]):
    """One queued write's outcome: its result or error, whether it is done or abandoned."""

    __slots__ = (
        "_callbacks",
        "_done",
        "_result",
        "abandoned",
        "accept",
        "error",
        "finish",
        "finished",
        "lines",
        "on_commit",
        "stage",
        "touches",
    )

    def __init__(
        self,
        on_commit: Callable[[T_co], None] | None = None,
        stage: str = "store",
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
    ) -> None:
        #: called on the event loop once the op committed (not when it failed)
        self.on_commit = on_commit
        self._result: tuple[T_co] | None = None
        self.error: BaseException | None = None
        #: the committer is done with it (committed or failed); `_done` exists only while a
        #: caller waits (the ops of one batch end together: most callers never wait)
        self.finished = False
        self._done: anyio.Event | None = None
        self._callbacks: list[Callable[[], None]] | None = None
        #: set by a caller cancelled before its op was taken: the committer skips it
        self.abandoned = False
        #: where its CPU time counts (`supervisor.stages`): "commit" for endings
        self.stage = stage
        #: an accept (no idempotency key) or an ending: it may run with the batch's others of
        #: its kind (`supervisor.store.grouping`)
        self.accept = accept
        self.finish = finish
        #: the turn it writes (`grouping.NEW_TURN`: only a turn it creates; None: unknown),
        #: which says whether the batch's endings may run after it
        self.touches = touches
        #: the ledger lines the op seals once its fence held (an ending's, a resolution's)
        self.lines = finish.lines if finish is not None else lines

    def settle(self, outcome: object) -> None:
        """The outcome of the op as run in a group: its value, or the error that refused it."""
        if isinstance(outcome, Exception):
            self.error = outcome
        else:
            self._result = (outcome,)  # type: ignore[assignment]

    def complete(self) -> None:
        """The committer is done with the op: its caller may take the outcome (its
        callbacks run now, on the event loop; an error in one is logged, never the
        committer's)."""
        self.finished = True
        if self._done is not None:
            self._done.set()
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:
                _log.exception("store_write_callback_failed")

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call *callback* once the committer is done with the op (now, if it is)."""
        if self.finished:
            callback()
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    async def wait(self) -> None:
        """Until the committer is done with the op (no wait, not even a checkpoint, once it is:
        a pass's callers take the outcomes of one batch one after the other)."""
        if self.finished:
            return
        if self._done is None:
            self._done = anyio.Event()
        await self._done.wait()

    def reset(self) -> None:
        """Forget an outcome whose transaction was rolled back (the op runs again)."""
        self._result = None
        self.error = None

    def withdraw(self) -> None:
        """The op's transaction (or its savepoint) was rolled back: an ending takes back the
        ledger lines it sealed (`supervisor.store.sealing`); a rerun seals them again."""
        if self.lines is not None:
            withdraw_all((self.lines,))

    def committed(self) -> None:
        if self.on_commit is not None and self.error is None and self._result is not None:
            try:
                self.on_commit(self._result[0])
            except Exception:  # the caller's hook must not stop the committer
                _log.exception("store_commit_hook_failed")

    def fail(self, error: BaseException) -> None:
        self._result = None
        self.error = error

    def result(self) -> T_co:
        if self.error is not None:
            raise self.error
        if self._result is None:
            raise IntakeClosedError("turn store stopped before this write committed")
        return self._result[0]


def withdraw_batch(batch: Sequence[QueuedOp[object]]) -> None:
    """A batch's transaction was rolled back: its endings take back the lines they sealed,
    last first (a line leaves its chain only from the end)."""
    withdraw_all(op.lines for op in batch)


class PendingOp(Generic[T_co]):
    """`PendingWrite` over a queued op."""

    __slots__ = ("_op",)

    def __init__(self, op: QueuedOp[T_co]) -> None:
        self._op = op

    def when_done(self, callback: Callable[[], None]) -> None:
        self._op.when_done(callback)

    def outcome(self) -> T_co:
        return self._op.result()

    async def result(self) -> T_co:
        op = self._op
        try:
            await op.wait()
        except BaseException:  # cancelled: the op is skipped if its batch has not started
            op.abandoned = True
            raise
        return op.result()
