"""The answers of one control connection that are sent without a task of their own.

A submit-and-wait of an instruction turn (the hot path) is taken by the turn core without a
task (`TurnCore.submit_soon`, `TurnCore.settled_soon`): its answer is sent from a callback when
the turn is accepted or settles. `Replies` is what such a callback needs of the connection: the
frame writer (answers of one pass leave in one write), the connection's task group for the rare
step that must await (a turn read from the store after an escalation or a timeout, a writer
that is over its high-water mark), the timers of the waits, and the count of answers owed.
Once the connection is gone (`close`), answers are dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import anyio
import anyio.abc

from supervisor.logging import get_logger
from supervisor.stages import stage_costs
from supervisor.timers import Timers
from supervisor.wire.frames import FrameTooLarge, FrameWriter, encode_frame

__all__ = ["Replies"]

_COSTS = stage_costs()


class Replies:
    """What answers sent from callbacks need of their connection."""

    __slots__ = ("_log", "_max_frame_bytes", "_open", "_tg", "_writer", "owed", "timers")

    def __init__(
        self, writer: FrameWriter, tg: anyio.abc.TaskGroup, *, max_frame_bytes: int
    ) -> None:
        self._writer = writer
        self._tg = tg
        self._max_frame_bytes = max_frame_bytes
        self._log = get_logger("supervisor.control")
        self._open = True
        #: answers owed by callbacks (they count against the connection's request limit)
        self.owed = 0
        self.timers = Timers()

    def close(self) -> None:
        """The connection is gone: answers owed are dropped."""
        self._open = False

    def send(self, response: Mapping[str, object], op: str) -> None:
        """Send one owed answer (one pass's answers leave in one write)."""
        self.owed -= 1
        if not self._open:
            return
        started = _COSTS.clock()
        try:
            frame = encode_frame(response, max_bytes=self._max_frame_bytes)
        except FrameTooLarge as exc:  # the client would refuse it: say so, keep the connection
            self._log.warning("control_reply_too_large", op=op, size=exc.size)
            frame = encode_frame(
                {
                    "id": response.get("id"),
                    "ok": False,
                    "error": {
                        "code": "reply_too_large",
                        "message": (
                            f"the answer to {op} is {exc.size} bytes, over the"
                            f" {exc.max_bytes}-byte frame limit; ask for less"
                        ),
                    },
                }
            )
        _COSTS.add("reply", _COSTS.clock() - started)
        if not self._writer.send_nowait(frame, cork=self.owed > 0):
            self._tg.start_soon(self._send_later, frame)

    async def _send_later(self, frame: bytes) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._writer.send(frame)

    def spawn(self, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a step that awaits (a store read) in the connection's task group."""
        if self._open:
            self._tg.start_soon(step)
        else:
            self.owed -= 1
