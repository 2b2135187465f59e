"""A pgqueuer worker process running the no-op job: ``python -m benchmarks.peers.pgq_worker DSN``.

pgqueuer's defaults (batch size 10, no concurrency cap, its durable tables); it stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer

ENTRYPOINT = "hh_noop"


async def serve(dsn: str) -> None:
    """Run the worker until SIGTERM or SIGINT."""
    connection = await asyncpg.connect(dsn)
    try:
        pgq = PgQueuer(AsyncpgDriver(connection))

        @pgq.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            """The same work as the daemon's no-op executor: nothing, then a success."""

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, pgq.shutdown.set)
        await pgq.run()
    finally:
        await connection.close()


def main() -> int:
    asyncio.run(serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
