"""What the example executors' command lines share: logging to stderr and signal handling."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import anyio
import structlog

from supervisor.sdk import ExecutorRejected

__all__ = ["EXIT_REJECTED", "EXIT_UNREACHABLE", "configure_example_logging", "run_until_signal"]

#: Exit code when the daemon refused the executor for good.
EXIT_REJECTED = 3
#: Exit code when the daemon's socket cannot be reached (with --no-reconnect).
EXIT_UNREACHABLE = 4


def configure_example_logging(level: str) -> None:
    """JSON log lines on stderr at ``level`` (stdout stays free for the example's output)."""
    try:
        from supervisor.logging import configure_logging
    except ImportError:  # the daemon's logging module is optional for the examples
        numeric = logging.getLevelNamesMapping().get(level.upper(), logging.WARNING)
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            cache_logger_on_first_use=True,
        )
    else:
        configure_logging(fmt="json", level=level.lower(), stream=sys.stderr)


def run_until_signal(main: Callable[[], Awaitable[None]]) -> int:
    """Run ``main`` until it returns or SIGTERM/SIGINT arrives; returns the exit code."""

    async def runner() -> int:
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_signals)
            try:
                await main()
            except ExecutorRejected as exc:
                sys.stderr.write(f"rejected by the daemon: {exc}\n")
                return EXIT_REJECTED
            except OSError as exc:  # --no-reconnect and the daemon's socket is not there
                sys.stderr.write(f"cannot reach the daemon: {exc}\n")
                return EXIT_UNREACHABLE
            finally:
                tg.cancel_scope.cancel()
        return 0

    return anyio.run(runner)
