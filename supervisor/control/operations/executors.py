"""``executors.list`` and ``executors.wait``: the executors the hub knows."""

from __future__ import annotations

import anyio

from supervisor.control.answers import executor_answer
from supervisor.errors import RequestError
from supervisor.executors.hub import ExecutorHub
from supervisor.wire.control import ExecutorsListParams, ExecutorsWaitParams

__all__ = ["ExecutorOperations"]


class ExecutorOperations:
    """The executor operations of one `ExecutorHub`."""

    def __init__(self, hub: ExecutorHub) -> None:
        self._hub = hub

    async def list_executors(self, params: ExecutorsListParams) -> object:
        known = sorted(
            (i for i in self._hub.list_executors() if i.executor_id > params.after_executor_id),
            key=lambda i: i.executor_id,
        )
        page = known[: params.limit]
        return {
            "executors": [executor_answer(i) for i in page],
            # pass as after_executor_id for the next page; null on the last page
            "next_after": page[-1].executor_id if len(known) > params.limit else None,
        }

    async def wait(self, params: ExecutorsWaitParams) -> object:
        """Wait until an executor is known with a status (default READY); for tools and tests."""
        executor_id = params.executor_id
        status = params.status
        status_value = None if status is None else status.value
        timeout = params.timeout_s
        with anyio.move_on_after(float(timeout)):
            info = await self._hub.wait_for_executor(executor_id, status=status)
            return {"executor": executor_answer(info)}
        raise RequestError(
            "timeout",
            f"executor {executor_id!r} did not reach {status_value} within {timeout} s",
            executor_id=executor_id,
        )
