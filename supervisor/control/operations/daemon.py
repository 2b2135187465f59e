"""``ping``, ``status`` and ``drain``: the daemon itself. ``status`` gathers every part's
statistics (the turn core, the store, the hub, the sandbox, the change feed, the stage costs)
and bounds its read of the store, so it answers at once while the store is unreachable."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Final

import anyio

from sandbox.policy.lifecycle import TurnState
from supervisor.control.answers import executor_answer, statistics_answer
from supervisor.control.operations.attribution import caller_decision
from supervisor.errors import RequestError
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.peercred import PeerCredentials
from supervisor.feed import Feed
from supervisor.logging import get_logger
from supervisor.stages import stage_costs
from supervisor.turns.core import TurnCore
from supervisor.wire.control import DrainParams, NoParams

__all__ = ["CONTROL_PROTOCOL_VERSION", "DaemonOperations"]

_COSTS: Final = stage_costs()
CONTROL_PROTOCOL_VERSION: Final = 1

#: `status` lists at most this many active turns (the oldest); ``in_flight_total`` counts all
_IN_FLIGHT_SHOWN = 100
#: ... and at most this many executors (by id); ``executors_total`` counts all
_EXECUTORS_SHOWN = 100
#: How long `status` waits for the store's counts before answering without them.
_STORE_READ_S = 1.0


class DaemonOperations:
    """The daemon's own operations. *info*: what ``ping`` and ``status`` tell of the daemon
    (its root, its socket); *sandbox*: the sandbox's enforcement now; *feed*: the change feed
    ``events.subscribe`` follows; *on_drain*: how a drain starts (None: ``drain`` is refused;
    the control connection calls it once the answer is written)."""

    def __init__(
        self,
        *,
        turn_core: TurnCore,
        hub: ExecutorHub,
        feed: Feed,
        info: Mapping[str, object],
        sandbox: Callable[[], Mapping[str, object]] | None,
        on_drain: Callable[[], None] | None,
    ) -> None:
        self._turn_core = turn_core
        self._hub = hub
        self._feed = feed
        self._info = info
        self._sandbox = sandbox
        self._on_drain = on_drain
        # the control server's events, under its name
        self._log = get_logger("supervisor.control.server")

    async def ping(self, params: NoParams) -> object:
        return {
            "pong": True,
            "pid": os.getpid(),
            "protocol": CONTROL_PROTOCOL_VERSION,
            **self._info,
        }

    async def status(self, params: NoParams) -> object:
        executors = sorted(self._hub.list_executors(), key=lambda i: i.executor_id)
        stats = self._turn_core.statistics()
        hub_stats = self._hub.statistics()
        # The store's part is bounded: while its server is unreachable, status still answers
        # at once from what the daemon holds (store.available says so).
        counts: dict[str, int] = {}
        fleet = None
        with anyio.move_on_after(_STORE_READ_S):
            counts = await self._turn_core.counts()
            fleet = await self._turn_core.daemons()
        turns = stats.to_dict()
        turns["turns_escalated"] = counts.get(TurnState.ESCALATED.value, 0)
        # a daemon whose heartbeat is older than the lease is gone (its work is taken over)
        now_us = time.time_ns() // 1000
        lease_us = self._turn_core.settings.lease_ms * 1000
        return {
            # several daemons on one PostgreSQL: each with its last heartbeat (None: alone)
            "daemons": None
            if fleet is None
            else [
                {**d.to_dict(), "alive": now_us - d.heartbeat_us <= lease_us}
                for d in fleet[:_EXECUTORS_SHOWN]
            ],
            "daemon": {"pid": os.getpid(), "draining": stats.draining, **self._info},
            "turn_core": turns,
            "scheduler": turns,  # the former key of turn_core, kept for one more release
            "store": asdict(self._turn_core.store_statistics()),
            "turns_by_state": counts,
            "in_flight": self._turn_core.in_flight(limit=_IN_FLIGHT_SHOWN),
            "in_flight_total": turns["turns_active"],
            "hub": statistics_answer(hub_stats),
            "executors": [executor_answer(i) for i in executors[:_EXECUTORS_SHOWN]],
            "executors_total": len(executors),
            # the daemon-wide retry budget's window (docs/policy.md "The retry budget")
            "retry_budget": self._turn_core.retry_budget().to_dict(),
            "sandbox": None if self._sandbox is None else dict(self._sandbox()),
            # CPU per stage of a turn's path (`supervisor.stages`; on with HUNTER_STAGE_COSTS=1)
            "stages": _COSTS.snapshot(),
            # the change feed (`events.subscribe`): its newest cursor, who follows it
            "events": {
                "cursor": self._feed.cursor,
                "published": self._feed.published,
                "subscribers": self._feed.subscribers,
                "cut_off": self._feed.cut_off,
            },
        }

    async def drain(self, params: DrainParams, peer: PeerCredentials | None) -> object:
        """A decision, attributed to *peer*; the drain starts once this answer is written."""
        if self._on_drain is None:
            raise RequestError("bad_request", "drain: this server cannot be drained remotely")
        decision = await caller_decision("drain", peer, params.operator, params.reason)
        self._log.info(
            "drain_requested",
            uid=decision.uid,
            pid=decision.pid,
            operator=decision.operator,
            reason=decision.reason,
        )
        # the drain starts once this answer is written
        return {"draining": True, "decided_by": decision.to_dict()}
