"""How a turn store runs in a ``with`` block: its committer in a task group of its own.

Both engines' ``open_*_store`` context managers are this one, around the store they build:
apart from the engines because it knows nothing of either, only that a store has a `run` to
start and an `aclose` that lets the queued writes commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import anyio
import anyio.abc

__all__ = ["Runnable", "running"]


class Runnable(Protocol):
    """A store with a committer to run (`SqliteTurnStore`, `PostgresTurnStore`)."""

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None: ...

    async def aclose(self) -> None: ...


StoreT = TypeVar("StoreT", bound=Runnable)


@asynccontextmanager
async def running(store: StoreT) -> AsyncIterator[StoreT]:
    """*store*, its committer running until the block ends (then the queued writes commit)."""
    # Errors (the store's, the block's) are raised again below, outside the task group, so
    # callers see them as themselves rather than wrapped in an exception group.
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        try:
            await tg.start(store.run)
        except Exception as exc:
            failed = exc
        else:
            try:
                yield store
            except Exception as exc:
                failed = exc
            finally:
                with anyio.CancelScope(shield=True):
                    await store.aclose()
    if failed is not None:
        raise failed
