"""Dispatch: the bounded per-command queues, and which READY executor gets an attempt.

An attempt first tries ``pick``: the least-loaded READY executor with a free slot for its
command (in-flight ÷ slots; ties go to the first registered). With none, it waits in its
command's FIFO queue (``wait``, bounded by ``queue_wait_s``) until ``slot_freed`` hands it a
slot of an executor that finished something, changed status or connected; the oldest waiter of
any command the executor supports goes first. Admission (``admit``) refuses work when a queue is
at capacity, with a retry hint from the recent attempt durations; waiting never drops work.

``free_slots`` and ``connected`` are asked on every turn the core starts (and every submit), so
they read running totals per command instead of summing over the executors: a connection calls
``recount`` (through its host) after each change of its load or status, which moves the totals
by that one executor's difference. Idle executors cost nothing per turn.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable

import anyio

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.errors import QueueFullError
from supervisor.executors.clock import ms
from supervisor.executors.connection import Connection
from supervisor.executors.settings import queue_wait_limit

__all__ = ["Dispatcher", "Waiter"]


class Waiter:
    """An attempt waiting in a command queue for a free executor slot."""

    __slots__ = ("conn", "enqueued_at", "event", "instruction_id")

    def __init__(self, instruction_id: str, enqueued_at: float) -> None:
        self.instruction_id = instruction_id
        self.enqueued_at = enqueued_at
        self.event = anyio.Event()
        self.conn: Connection | None = None


class Dispatcher:
    """Executors by command, and the queue of attempts waiting for each command."""

    __slots__ = ("_counted", "_free", "_members", "_notify", "_open", "_queues")

    def __init__(self, *, notify: Callable[[], None]) -> None:
        """``notify`` is called when an executor turns READY again (status watchers)."""
        self._notify = notify
        self._members: dict[ExecutorCommandType, list[Connection]] = {
            c: [] for c in ExecutorCommandType
        }
        self._queues: dict[ExecutorCommandType, collections.deque[Waiter]] = {
            c: collections.deque() for c in ExecutorCommandType
        }
        # Running totals per command over the members (see the module docstring): free slots as
        # last counted, and members not closed. ``_counted``: each member's free slots as
        # counted in ``_free``, and whether it is counted open.
        self._free: dict[ExecutorCommandType, int] = dict.fromkeys(ExecutorCommandType, 0)
        self._open: dict[ExecutorCommandType, int] = dict.fromkeys(ExecutorCommandType, 0)
        self._counted: dict[Connection, tuple[int, bool]] = {}

    # ------------------------------------------------------------------ executors
    def add(self, conn: Connection) -> None:
        """Make ``conn`` a candidate for the commands it supports."""
        free, is_open = conn.free_slots, not conn.closed
        for command in conn.commands:
            self._members[command].append(conn)
            self._free[command] += free
            self._open[command] += is_open
        self._counted[conn] = (free, is_open)

    def remove(self, conn: Connection) -> None:
        counted = self._counted.pop(conn, None)
        for command in conn.commands:
            members = self._members[command]
            if conn in members:
                members.remove(conn)
                if counted is not None:
                    self._free[command] -= counted[0]
                    self._open[command] -= counted[1]

    def recount(self, conn: Connection) -> None:
        """``conn``'s load or status may have changed: move the totals by its difference (O(1)
        in the number of executors; nothing for a connection that is not a member)."""
        counted = self._counted.get(conn)
        if counted is None:
            return
        free, is_open = conn.free_slots, not conn.closed
        was_free, was_open = counted
        if free == was_free and is_open == was_open:
            return
        self._counted[conn] = (free, is_open)
        free_delta, open_delta = free - was_free, is_open - was_open
        for command in conn.commands:
            self._free[command] += free_delta
            self._open[command] += open_delta

    def pick(self, command: ExecutorCommandType, instruction_id: str) -> Connection | None:
        """Least-loaded READY executor with a free slot for ``command`` (in-flight ÷ slots;
        ties go to the first registered), or ``None``. This is the hot path."""
        best: Connection | None = None
        best_ratio = 2.0
        for conn in self._members[command]:
            load = conn.load_if_accepting(instruction_id)
            if load is None:
                continue
            ratio = load / conn.slots
            if ratio < best_ratio:
                best, best_ratio = conn, ratio
                if load == 0:
                    break
        return best

    # ------------------------------------------------------------------ queues
    def connected(self, command: ExecutorCommandType) -> int:
        """Connected executors that serve ``command`` (whatever their status)."""
        return self._open[command]

    def free_slots(self, command: ExecutorCommandType) -> int:
        """Free slots of READY executors serving ``command``, less the attempts waiting in its
        queue (negative when more wait than there are slots)."""
        return self._free[command] - len(self._queues[command])

    def admit(
        self,
        command_type: ExecutorCommandType,
        capacity: int,
        *,
        per_attempt_s: float,
        waiting: int = 0,
    ) -> None:
        """Raise ``QueueFullError`` if ``command_type``'s queue, with ``waiting`` turns the
        caller holds back, reaches ``capacity``; the retry hint assumes attempts of
        ``per_attempt_s`` spread over the connected slots."""
        queued = len(self._queues[command_type]) + waiting
        if queued >= capacity:
            slots = sum(c.slots for c in self._members[command_type] if not c.closed)
            retry_s = per_attempt_s * (queued - capacity + 1) / max(1, slots)
            retry_after_ms = min(60_000, max(100, ms(retry_s)))
            raise QueueFullError(command_type, capacity, retry_after_ms)

    async def wait(
        self, command: ExecutorCommandType, instruction_id: str, wait_s: float
    ) -> Connection | None:
        """Wait (bounded by ``wait_s``) until a slot is handed over; ``None`` if not."""
        queue = self._queues[command]
        deadline = anyio.current_time() + wait_s
        while True:
            waiter = Waiter(instruction_id, time.monotonic())
            queue.append(waiter)
            try:
                with anyio.CancelScope(deadline=deadline):
                    await waiter.event.wait()
            except BaseException:
                self._abandon(queue, waiter)
                raise
            conn = waiter.conn
            if conn is None:
                self._abandon(queue, waiter)
                return None
            conn.unreserve()
            if not conn.closed:
                return conn
            # The executor went away between the hand-over and now: look again.
            conn = self.pick(command, instruction_id)
            if conn is not None:
                return conn

    def _abandon(self, queue: collections.deque[Waiter], waiter: Waiter) -> None:
        if waiter.conn is None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
        else:  # a slot was handed over but will not be used: pass it on
            conn, waiter.conn = waiter.conn, None
            conn.unreserve()
            self.slot_freed(conn)

    def slot_freed(self, conn: Connection) -> None:
        """Hand free slots of ``conn`` to the oldest waiters of the commands it supports."""
        if conn.load == conn.slots - 1:
            self._notify()  # BUSY -> READY (wait_for_executor watchers)
        while not conn.closed and conn.load < conn.slots:
            best: Waiter | None = None
            best_queue: collections.deque[Waiter] | None = None
            for command in conn.commands:
                queue = self._queues[command]
                for waiter in queue:
                    if conn.accepts(waiter.instruction_id):
                        if best is None or waiter.enqueued_at < best.enqueued_at:
                            best, best_queue = waiter, queue
                        break
            if best is None or best_queue is None:
                return
            best_queue.remove(best)
            best.conn = conn
            conn.reserve()
            best.event.set()

    def close(self) -> None:
        """Send every waiter away empty-handed (the hub is closing)."""
        for queue in self._queues.values():
            for waiter in queue:
                waiter.event.set()
            queue.clear()

    # ------------------------------------------------------------------ figures
    def queued_by_command(self) -> dict[str, int]:
        """Waiters per command type (non-empty queues only)."""
        return {c.value: len(q) for c, q in self._queues.items() if q}

    def timeout_detail(
        self, command: ExecutorCommandType, *, queued_ms: int, limit_s: float, configured_s: float
    ) -> str:
        """Why an attempt for ``command`` found no slot (its report detail): its whole wait,
        *queued_ms*, and the limit it reached (`queue_wait_limit`)."""
        limit = queue_wait_limit(limit_s, configured_s)
        conns = [c for c in self._members[command] if not c.closed]
        if not conns:
            return (
                f"no executor supporting {command.value} was connected; the attempt waited"
                f" queued_ms={queued_ms} ({limit})"
            )
        return (
            f"no {command.value} executor had a free slot; the attempt waited"
            f" queued_ms={queued_ms} ({limit}; {len(conns)} connected, statuses: "
            f"{', '.join(sorted({c.status.value for c in conns}))})"
        )
