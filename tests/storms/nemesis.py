"""The nemesis: faults drawn from a seed, done to the fleet while the load runs.

`schedule` draws the run's faults from ``random.Random(seed)``: each requested kind once in a
seeded order, then random kinds until the load's end, each with its parameters and a pause of
2-6 s after it. The kinds:

``pause``
    SIGSTOP a daemon for ``pause_s`` (8 s: well past a 2 s lease), then SIGCONT.
``pause-commit``
    SIGSTOP a daemon the moment one of its database connections is inside a transaction (its
    backend in ``pg_stat_activity`` has an ``xact_start``, found through its proxy's ports):
    a stop that lands mid-commit, with row locks held; 3-8 s, then SIGCONT.
``kill``
    SIGKILL a daemon; after 3-8 s start it again on its own root, as an operator would.
``pg-restart``
    ``pg_ctl restart -m fast``: every connection of every daemon is cut.
``delay``
    200-800 ms added to every chunk through one daemon's proxy, or every proxy's, for 4-10 s.
``partition``
    one daemon's proxy black-holes its traffic for 2-6 s; half the time every connection is
    cut when it heals (the partition outlasted TCP).

The target of a fault is chosen when it fires: the running daemon that homes the most open
sessions (so that a fault has something to take over), ties broken by the fault's drawn number.
For ``pause``, ``pause-commit`` and ``kill`` the takeover is measured: the time from the fault
until every session the daemon homed at that moment is homed by another daemon, or the daemon
is back (resumed, restarted), whichever comes first (``how`` says which). Everything goes to the
history.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import anyio
import asyncpg

from tests.storms.cluster import TcpCluster
from tests.storms.fleet import Fleet, FleetError, Member
from tests.storms.history import History
from tests.storms.proxy import Proxy
from tests.storms.starvation import CpuQuota

__all__ = ["FAULT_KINDS", "Fault", "Nemesis", "schedule"]

FAULT_KINDS: Final = ("pause", "pause-commit", "kill", "pg-restart", "delay", "partition")
#: the kinds whose takeover is measured
TAKEOVER_KINDS: Final = frozenset({"pause", "pause-commit", "kill"})


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: what, when (seconds after the load began), for how long."""

    kind: str
    at_s: float
    hold_s: float
    #: breaks ties between equally busy targets
    pick: float
    delay_ms: int = 0
    #: ``delay``: every proxy, not one; ``partition``: cut the connections when it heals
    wide: bool = False

    def describe(self) -> str:
        extra = ""
        if self.kind == "delay":
            extra = f" {self.delay_ms} ms{' on every proxy' if self.wide else ''}"
        elif self.kind == "partition" and self.wide:
            extra = ", connections cut when it heals"
        return f"{self.kind} for {self.hold_s:.1f} s{extra}"


def _hold(kind: str, rng: random.Random, pause_s: float) -> float:
    if kind == "pause":
        return pause_s
    if kind == "pause-commit":
        return rng.uniform(3.0, 8.0)
    if kind == "kill":
        return rng.uniform(3.0, 8.0)
    if kind == "delay":
        return rng.uniform(4.0, 10.0)
    if kind == "partition":
        return rng.uniform(2.0, 6.0)
    return 0.0


def schedule(
    seed: int,
    kinds: Sequence[str],
    *,
    duration_s: float,
    warmup_s: float = 4.0,
    pause_s: float = 8.0,
) -> list[Fault]:
    """The run's faults (see the module docstring); none starts after ``duration_s``."""
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    rng = random.Random(f"nemesis-{seed}")
    first = list(dict.fromkeys(kinds))
    rng.shuffle(first)
    faults: list[Fault] = []
    t = warmup_s
    while kinds and t < duration_s:
        kind = first.pop(0) if first else rng.choice(list(kinds))
        hold = _hold(kind, rng, pause_s)
        faults.append(
            Fault(
                kind=kind,
                at_s=round(t, 3),
                hold_s=round(hold, 3),
                pick=rng.random(),
                delay_ms=rng.randrange(200, 801) if kind == "delay" else 0,
                wide=rng.random() < 0.5 if kind in {"delay", "partition"} else False,
            )
        )
        t += hold + rng.uniform(2.0, 6.0)
    return faults


class Nemesis:
    """Does the scheduled faults to the fleet (see the module docstring)."""

    def __init__(
        self,
        fleet: Fleet,
        cluster: TcpCluster,
        history: History,
        *,
        dsn: str,
        quota: CpuQuota | None = None,
        show: Callable[[str], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.cluster = cluster
        self.history = history
        self.dsn = dsn
        self.quota = quota
        self._show = show
        self.done: list[Fault] = []

    def _say(self, line: str) -> None:
        if self._show is not None:
            self._show(line)

    async def run(self, faults: Sequence[Fault], *, started: float) -> None:
        """Do *faults* in order, each at its moment after *started* (``anyio.current_time``);
        a fault never starts before the one before it ended."""
        for fault in faults:
            await anyio.sleep_until(started + fault.at_s)
            conn = await self._connect()
            try:
                await self._do(conn, fault)
            finally:
                await conn.close()
            self.done.append(fault)

    async def _connect(self) -> asyncpg.Connection:
        """A connection of the nemesis's own, straight to the server (no proxy); retried for a
        while, since the server may be restarting."""
        with anyio.fail_after(60):
            while True:
                try:
                    return await asyncpg.connect(self.dsn)
                except (OSError, asyncpg.PostgresError):
                    await anyio.sleep(0.2)

    async def _target(self, conn: asyncpg.Connection) -> Member | None:
        """The running daemon homing the most open sessions (None: none is running)."""
        candidates = self.fleet.running()
        if not candidates:
            return None
        rows = await conn.fetch(
            "SELECT d.pid, count(s.session_id) AS homed FROM daemons d"
            " LEFT JOIN sessions s ON s.home = d.owner AND s.state = 'open' GROUP BY d.pid"
        )
        homed = {int(r["pid"]): int(r["homed"]) for r in rows}
        return max(candidates, key=lambda m: (homed.get(m.pid or -1, 0), m.name))

    async def _owner(
        self, conn: asyncpg.Connection, member: Member
    ) -> tuple[str | None, list[str]]:
        """The daemon's owner id in the store and the open sessions it homes now."""
        owner = await conn.fetchval(
            "SELECT owner FROM daemons WHERE pid = $1 ORDER BY started_us DESC LIMIT 1",
            member.pid,
        )
        if owner is None:
            return None, []
        rows = await conn.fetch(
            "SELECT session_id FROM sessions WHERE state = 'open' AND home = $1", owner
        )
        return str(owner), [str(r["session_id"]) for r in rows]

    async def _do(self, conn: asyncpg.Connection, fault: Fault) -> None:
        if fault.kind == "pg-restart":
            self.history.record("nemesis", f=fault.kind, phase="start")
            self._say("nemesis: pg_ctl restart -m fast")
            await anyio.to_thread.run_sync(self.cluster.restart)
            self.history.record("nemesis", f=fault.kind, phase="end")
            return
        if fault.kind == "delay" and fault.wide:
            proxies = [m.proxy for m in self.fleet]
            await self._delay(fault, proxies, "every daemon")
            return
        target = await self._target(conn)
        if target is None:
            self.history.record("nemesis", f=fault.kind, phase="skipped", why="no daemon runs")
            return
        if fault.kind == "delay":
            await self._delay(fault, [target.proxy], target.name)
        elif fault.kind == "partition":
            await self._partition(fault, target)
        else:
            await self._stop_or_kill(conn, fault, target)

    async def _delay(self, fault: Fault, chosen: Sequence[Proxy], who: str) -> None:
        self.history.record(
            "nemesis", f=fault.kind, phase="start", target=who, delay_ms=fault.delay_ms
        )
        self._say(
            f"nemesis: {fault.delay_ms} ms delay to PostgreSQL for {who}, {fault.hold_s:.1f} s"
        )
        for proxy in chosen:
            proxy.set_delay(fault.delay_ms / 1000)
        try:
            await anyio.sleep(fault.hold_s)
        finally:
            for proxy in chosen:
                proxy.set_delay(0.0)
        self.history.record("nemesis", f=fault.kind, phase="end", target=who)

    async def _partition(self, fault: Fault, target: Member) -> None:
        self.history.record(
            "nemesis", f=fault.kind, phase="start", target=target.name, cut=fault.wide
        )
        self._say(
            f"nemesis: black hole between daemon {target.name} and PostgreSQL, {fault.hold_s:.1f} s"
        )
        target.proxy.set_black_hole(True)
        try:
            await anyio.sleep(fault.hold_s)
        finally:
            cut = target.proxy.cut() if fault.wide else 0
            target.proxy.set_black_hole(False)
        self.history.record("nemesis", f=fault.kind, phase="end", target=target.name, cut=cut)

    async def _in_transaction(self, conn: asyncpg.Connection, member: Member) -> str | None:
        """Wait (up to 5 s) until one of *member*'s connections is inside a transaction; what
        it ran (state and statement), or None when none was seen."""
        with anyio.move_on_after(5.0):
            while True:
                ports = sorted(member.proxy.upstream_ports)
                if ports:
                    row = await conn.fetchrow(
                        "SELECT state, left(query, 100) AS query FROM pg_stat_activity"
                        " WHERE client_port = ANY($1::int[]) AND xact_start IS NOT NULL"
                        " AND state <> 'idle' LIMIT 1",
                        ports,
                    )
                    if row is not None:
                        return f"{row['state']}: {row['query']}"
                await anyio.sleep(0.002)
        return None

    async def _stop_or_kill(self, conn: asyncpg.Connection, fault: Fault, target: Member) -> None:
        owner, homed = await self._owner(conn, target)
        caught = None
        if fault.kind == "pause-commit":
            caught = await self._in_transaction(conn, target)
        pid = target.pid
        t0 = anyio.current_time()
        if fault.kind == "kill":
            await target.kill()
        else:
            target.stop()
        self.history.record(
            "nemesis",
            f=fault.kind,
            phase="start",
            target=target.name,
            pid=pid,
            owner=owner,
            homed=len(homed),
            caught=caught,
        )
        self._say(
            f"nemesis: {'SIGKILL' if fault.kind == 'kill' else 'SIGSTOP'} daemon {target.name}"
            f" (pid {pid}, homes {len(homed)} sessions) for {fault.hold_s:.1f} s"
            + (f", caught {caught}" if caught else "")
        )
        back = anyio.Event()
        measured: dict[str, object] = {}

        async def watch() -> None:
            watcher = await self._connect()
            try:
                while homed:
                    left = await watcher.fetchval(
                        "SELECT count(*) FROM sessions WHERE session_id = ANY($1::text[])"
                        " AND (home IS NULL OR home = $2)",
                        homed,
                        owner,
                    )
                    if left == 0:
                        measured.update(how="taken over", seconds=anyio.current_time() - t0)
                        return
                    if back.is_set():
                        measured.update(
                            how="daemon back", seconds=anyio.current_time() - t0, left=left
                        )
                        return
                    await anyio.sleep(0.05)
                measured.update(how="homed none", seconds=0.0)
            finally:
                await watcher.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            try:
                await anyio.sleep(fault.hold_s)
            finally:
                with anyio.CancelScope(shield=True):
                    if fault.kind == "kill":
                        try:
                            await target.restart()
                        except FleetError as exc:  # a finding (the run goes on without it)
                            self.history.record(
                                "nemesis", f="restart-failed", target=target.name, error=str(exc)
                            )
                            self._say(f"nemesis: daemon {target.name} did not come back: {exc}")
                        if self.quota is not None and target.pid is not None:
                            self.quota.add(target.pid)
                    else:
                        target.resume()
                    back.set()
        self.history.record(
            "nemesis", f=fault.kind, phase="end", target=target.name, pid=target.pid
        )
        self.history.record(
            "takeover", f=fault.kind, target=target.name, sessions=len(homed), **measured
        )
        self._say(
            f"nemesis: daemon {target.name} back (pid {target.pid}); takeover "
            f"{measured.get('how')} after {float(str(measured.get('seconds', 0))):.2f} s"
        )
