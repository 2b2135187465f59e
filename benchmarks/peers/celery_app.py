"""The Celery application of the dispatch comparison: one no-op task.

The workers load it with ``celery -A benchmarks.peers.celery_app worker``; the broker and result
backend URL and the setting come from the environment (``HH_CELERY_REDIS``,
``HH_CELERY_DURABLE``), which ``benchmarks/peers/celery_peer.py`` sets for them.
"""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

TASK_NAME = "hh.noop"


def make_app(url: str, *, durable: bool) -> Celery:
    """A Celery app on Redis *url* (broker and result backend). Durable: a task is
    acknowledged after it ran (``task_acks_late``) and a worker process reserves one task at a
    time (``worker_prefetch_multiplier=1``); otherwise Celery's defaults (ack on receipt,
    prefetch 4 per process)."""
    app = Celery("hh_compare", broker=url, backend=url)
    app.conf.update(
        task_acks_late=durable,
        worker_prefetch_multiplier=1 if durable else 4,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name=TASK_NAME)  # type: ignore[untyped-decorator]
    def noop() -> None:
        """The same work as the daemon's no-op executor: nothing, then a success."""

    return app


app = make_app(
    os.environ.get("HH_CELERY_REDIS", "redis://127.0.0.1:6379/0"),
    durable=os.environ.get("HH_CELERY_DURABLE") == "1",
)
