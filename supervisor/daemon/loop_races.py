"""One known harmless race of anyio's asyncio backend, reported as a warning (a debug line
while the daemon stops) instead of an error with a traceback (`guard_loop_races`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from supervisor.logging import get_logger

__all__ = ["LoopRaces", "guard_loop_races"]


@dataclass(slots=True)
class LoopRaces:
    """How `guard_loop_races` reports the race: set ``stopping`` once the daemon stops."""

    #: the daemon is stopping: every read is being cancelled, the race is expected (debug)
    stopping: bool = False


def guard_loop_races() -> LoopRaces:
    """On asyncio, report one known harmless race as a warning, not an error with a traceback.

    anyio's asyncio backend registers ``Future.set_result`` as a socket's reader callback; when
    the read is cancelled in the same loop pass in which the socket becomes readable, the
    callback finds the future cancelled and asyncio logs ``InvalidStateError`` at error level.
    The read was cancelled anyway and nothing is lost (the executor chaos suite provokes it).
    Once the daemon stops (``LoopRaces.stopping``) every connection's read is cancelled and the
    race is expected: it is logged at debug, so a clean stop logs nothing at warning or above.
    Every other exception goes to the handler that was there before.
    """
    races = LoopRaces()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # another backend: nothing to guard
        return races
    previous = loop.get_exception_handler()
    log = get_logger("supervisor.server")

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        callback = repr(context.get("handle", ""))
        if isinstance(exc, asyncio.InvalidStateError) and "Future.set_result" in callback:
            detail = str(context.get("message", ""))
            if races.stopping:
                log.debug("loop_callback_race", detail=detail, stopping=True)
            else:
                log.warning("loop_callback_race", detail=detail)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return races
