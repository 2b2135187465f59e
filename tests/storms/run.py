"""One nemesis run, start to verdict: the pieces put together.

1. A private PostgreSQL (`tests.storms.cluster`), a database for the run, a proxy per daemon
   (`tests.storms.proxy`), three daemons with two no-op executors each (`tests.storms.fleet`),
   sessions on every daemon.
2. CPU starvation begins (`tests.storms.starvation`), the load (`tests.storms.generator`) and the
   nemesis (`tests.storms.nemesis`) run side by side, everything recorded in the history; the
   starvation ends with the load.
3. Every daemon is running again; the fleet settles: until every acknowledged turn is final in
   the store, or ``settle_s`` passes.
4. Every daemon is asked, through the client, for the state of every acknowledged turn, and
   ``hunter ledger verify --root ROOT --store`` runs on every root while the daemons still run
   (their heartbeats name their roots). Then the daemons are stopped (SIGTERM), the store is
   exported and the export verified, and the store, the files, the workspaces and the logs are
   read and judged (`tests.storms.checker`).
5. Everything started is stopped and removed, also on failure (``keep``: the run's directory,
   with the history, the roots and their logs, stays for a look).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import asyncpg

from supervisor.client import Client, HunterError
from tests.storms.checker import (
    Check,
    CliResult,
    Verdict,
    check_acknowledged,
    check_answers,
    check_deadlocks,
    check_ledger_files,
    check_ledger_store,
    check_logs,
    check_run_records,
    check_takeovers,
    longest_call,
    read_store,
    server_errors,
    takeovers,
)
from tests.storms.cluster import TcpCluster, start_tcp_cluster
from tests.storms.fleet import DAEMON_NAMES, Fleet, FleetError, hunter
from tests.storms.generator import Load, LoadConfig
from tests.storms.history import History, read_history
from tests.storms.nemesis import FAULT_KINDS, Nemesis, schedule
from tests.storms.proxy import Proxy
from tests.storms.starvation import BusyLoops, CpuQuota

__all__ = ["NemesisConfig", "run_nemesis"]

DATABASE: Final = "nemesis"
_FINAL_SQL: Final = (
    "SELECT count(*) FROM turns WHERE turn_id = ANY($1::bigint[])"
    " AND state NOT IN ('succeeded', 'failed', 'timed_out', 'terminated', 'rejected', 'cancelled')"
)


@dataclass(frozen=True, slots=True)
class NemesisConfig:
    """What one run does; the defaults are the long run's."""

    seed: int = 1
    duration_s: float = 60.0
    turns: int = 600
    faults: tuple[str, ...] = FAULT_KINDS
    #: busy-loop processes while the load runs
    starve: int = 0
    #: (from, to) seconds after the load began: starve only then (None: the whole load)
    starve_window: tuple[float, float] | None = None
    #: CPU quota of the daemons' cgroup, percent of one CPU (None: none)
    cpu_quota: int | None = None
    lease_ms: int = 2000
    pause_s: float = 8.0
    settle_s: float = 60.0
    executors: int = 2
    lanes: int = 32
    call_timeout_s: float = 20.0
    #: a takeover slower than this is a finding (default: two leases and 2 s)
    takeover_bound_s: float | None = None
    #: keep the run's directory (history, roots, logs) afterwards
    keep: bool = False
    #: where to make the run's directory (None: the system's temporary directory)
    parent: Path | None = None
    load: LoadConfig = field(default_factory=LoadConfig)

    @property
    def bound_s(self) -> float:
        if self.takeover_bound_s is not None:
            return self.takeover_bound_s
        return 2 * self.lease_ms / 1000 + 2.0


def _nothing(line: str) -> None:
    del line


async def _settle(dsn: str, acknowledged: list[int], settle_s: float) -> int:
    """Wait until every acknowledged turn is final in the store (at most *settle_s*); how many
    are still not."""
    conn = await asyncpg.connect(dsn)
    try:
        left = len(acknowledged)
        with anyio.move_on_after(settle_s):
            while True:
                left = int(await conn.fetchval(_FINAL_SQL, acknowledged))
                if left == 0:
                    break
                await anyio.sleep(0.5)
        return left
    finally:
        await conn.close()


async def _answers(fleet: Fleet, acknowledged: list[int]) -> dict[str, dict[int, str]]:
    """Each running daemon's answer (the turn's state) about each acknowledged turn."""
    answers: dict[str, dict[int, str]] = {}
    for member in fleet.running():
        seen: dict[int, str] = {}
        try:
            async with Client(member.control_socket, reconnect_s=5) as client:
                for turn_id in acknowledged:
                    try:
                        with anyio.fail_after(10):
                            seen[turn_id] = (await client.get_turn(turn_id, compact=True)).state
                    except (HunterError, TimeoutError) as exc:
                        seen[turn_id] = f"error {type(exc).__name__}: {exc}"
        except Exception as exc:  # a daemon that cannot be asked is a finding, not a crash
            seen = dict.fromkeys(acknowledged, f"unreachable: {exc}")
        answers[member.name] = seen
    return answers


async def _verify_roots(fleet: Fleet, dsn: str) -> list[CliResult]:
    """``hunter ledger verify --root ROOT --store`` on every root, while the daemons still run
    (their heartbeats say which root is whose: a session another daemon homes is checked
    there, as docs/multi-host.md describes)."""
    results = []
    for member in fleet:
        code, out = await hunter(
            "ledger", "verify", "--root", str(member.root), "--store", "--dsn", dsn
        )
        results.append(CliResult(f"ledger verify --store on root {member.name}", code, out))
    return results


async def _verify_export(base: Path, dsn: str) -> list[CliResult]:
    """``hunter ledger export`` of the whole store, then ``verify --store`` on it."""
    export = base / "export"
    code, out = await hunter("ledger", "export", "--root", str(export), "--dsn", dsn)
    results = [CliResult("ledger export", code, out)]
    if code == 0:
        code, out = await hunter("ledger", "verify", "--root", str(export), "--store", "--dsn", dsn)
        results.append(CliResult("ledger verify --store on the export", code, out))
    return results


async def _load_and_faults(
    config: NemesisConfig,
    load: Load,
    nemesis: Nemesis,
    busy: BusyLoops,
    show: Callable[[str], None],
) -> None:
    faults = schedule(
        config.seed, config.faults, duration_s=config.duration_s, pause_s=config.pause_s
    )
    show(
        f"seed {config.seed}: {len(faults)} faults: "
        + "; ".join(f"{f.at_s:.0f}s {f.describe()}" for f in faults)
    )
    started = anyio.current_time()

    async def starve() -> None:
        if not config.starve:
            return
        begin, end = config.starve_window or (0.0, float("inf"))
        await anyio.sleep_until(started + begin)
        busy.start()
        load.history.record("nemesis", f="starve", phase="start", processes=config.starve)
        show(f"starvation: {config.starve} busy-loop processes")
        if end != float("inf"):
            await anyio.sleep_until(started + end)
            busy.stop()
            load.history.record("nemesis", f="starve", phase="end")

    async def progress() -> None:
        while True:
            await anyio.sleep(10)
            stats = load.statistics()
            show(
                f"  t={anyio.current_time() - started:5.0f}s acknowledged {stats.acknowledged}/"
                f"{stats.planned}, calls {stats.calls}, errors {stats.errors}, in flight "
                f"{load.in_flight}, running {[m.name for m in nemesis.fleet.running()]}"
            )

    async with anyio.create_task_group() as tg:
        tg.start_soon(starve)
        tg.start_soon(progress)
        async with anyio.create_task_group() as work:
            work.start_soon(functools.partial(nemesis.run, faults, started=started))
            await load.run()
        tg.cancel_scope.cancel()
    if busy.running:
        busy.stop()
        load.history.record("nemesis", f="starve", phase="end")


def _make_base(parent: Path | None) -> Path:
    """The run's directory (others may traverse it: process turns run as other uids) and its
    workspaces directory (readable by every sandbox uid)."""
    base = Path(tempfile.mkdtemp(prefix="hh-nemesis-", dir=parent))
    base.chmod(0o711)
    (base / "workspaces").mkdir()
    (base / "workspaces").chmod(0o755)
    return base


@dataclass(eq=False)
class _Run:
    """What one run holds while it runs (`run_nemesis`)."""

    config: NemesisConfig
    base: Path
    show: Callable[[str], None]
    history: History
    busy: BusyLoops
    cluster: TcpCluster | None = None
    fleet: Fleet | None = None
    quota: CpuQuota | None = None
    dsn: str = ""
    log_offset: int = 0

    @property
    def workspaces(self) -> Path:
        return self.base / "workspaces"

    async def start_cluster(self) -> TcpCluster:
        cluster = self.cluster = await anyio.to_thread.run_sync(start_tcp_cluster)
        await anyio.to_thread.run_sync(cluster.create_database, DATABASE)
        self.dsn = cluster.tcp_dsn(DATABASE)
        self.log_offset = cluster.server_log.stat().st_size
        self.show(f"run directory {self.base}; PostgreSQL on 127.0.0.1:{cluster.port}")
        return cluster

    async def start_fleet(self, proxies: list[Proxy]) -> Fleet:
        fleet = self.fleet = await Fleet.start(
            self.base,
            proxies=proxies,
            database=DATABASE,
            workspaces=self.workspaces,
            lease_ms=self.config.lease_ms,
            executors=self.config.executors,
        )
        self.show(f"fleet: {', '.join(f'{m.name} pid {m.pid}' for m in fleet)}")
        if self.config.cpu_quota is not None:
            self.quota, why = CpuQuota.create(self.config.cpu_quota)
            self.show(f"cpu quota: {why}")
            for member in fleet:
                if self.quota is not None and member.pid is not None:
                    self.quota.add(member.pid)
        return fleet

    async def load(self, cluster: TcpCluster, fleet: Fleet) -> None:
        """Sessions, then the load and the faults side by side; every daemon running after."""
        config = self.config
        load_config = dataclasses.replace(
            config.load,
            turns=config.turns,
            duration_s=config.duration_s,
            lanes=config.lanes,
            call_timeout_s=config.call_timeout_s,
        )
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                m.name: await stack.enter_async_context(Client(m.control_socket, reconnect_s=1.0))
                for m in fleet
            }
            load = Load(clients, self.history, load_config, seed=config.seed)
            sessions = await load.open_sessions(self.workspaces)
            self.show(
                f"{len(sessions)} sessions open; load: {config.turns} turns over "
                f"{config.duration_s:.0f} s"
            )
            nemesis = Nemesis(
                fleet, cluster, self.history, dsn=self.dsn, quota=self.quota, show=self.show
            )
            await _load_and_faults(config, load, nemesis, self.busy, self.show)
        for member in fleet:
            if not member.running:
                self.show(f"daemon {member.name} is not running: started again")
                self.history.record("nemesis", f="restart-at-end", target=member.name)
                try:
                    await member.restart()
                except FleetError as exc:  # the logs check names it (not running at the end)
                    self.show(f"daemon {member.name} did not start: {exc}")

    async def judge(self, cluster: TcpCluster, fleet: Fleet) -> Verdict:
        """Settle, ask the daemons, stop them, read everything, check."""
        ops, events = read_history(self.history.path)
        acknowledged = sorted(
            {op.turn_id for op in ops if op.type == "ok" and op.turn_id is not None}
        )
        self.show(
            f"load done: {len(acknowledged)} turns acknowledged; settling (at most "
            f"{self.config.settle_s:.0f} s)"
        )
        left = await _settle(self.dsn, acknowledged, self.config.settle_s)
        self.show(f"settled: {left} acknowledged turns not final")
        answers = await _answers(fleet, acknowledged)
        cli = await _verify_roots(fleet, self.dsn)
        exits: dict[str, int | None] = {}
        for member in fleet:
            exits[member.name] = await member.stack.stop_daemon() if member.running else None
        self.history.record("end")
        ended = self.history.now()
        self.show("daemons stopped; checking")
        store = await read_store(self.dsn)
        cli += await _verify_export(self.base, self.dsn)
        roots = {m.name: m.root for m in fleet}
        session_workspaces = {
            str(e["session_id"]): Path(str(e["workspace"]))
            for e in events
            if e.get("type") == "session"
        }
        logs_check, log_findings = check_logs({m.name: m.log for m in fleet}, exits)
        server_log = await anyio.Path(cluster.server_log).read_bytes()
        server_text = server_log[self.log_offset :].decode(errors="replace")
        deadlock_check, deadlocks = check_deadlocks(server_text)
        measured = takeovers(events)
        longest, which = longest_call(ops, ended=ended)
        checks: list[Check] = [
            check_acknowledged(ops, store),
            check_answers(answers, store, acknowledged),
            check_ledger_store(store),
            check_ledger_files(roots, store, cli),
            check_run_records(session_workspaces, roots, store),
            logs_check,
            check_takeovers(measured, bound_s=self.config.bound_s),
            deadlock_check,
        ]
        turns = store.by_id()
        return Verdict(
            seed=self.config.seed,
            checks=checks,
            acknowledged=len(acknowledged),
            final=sum(1 for t in acknowledged if t in turns and turns[t].final),
            calls=len(ops),
            errors=sum(1 for op in ops if op.type != "ok"),
            takeovers=measured,
            longest_call_s=longest,
            longest_call=(
                f"key {which.key} to daemon {which.daemon}, {which.type}"
                if which is not None
                else "none"
            ),
            deadlocks=deadlocks,
            server_errors=server_errors(server_text),
            faults=[
                f"{e['t']:.1f}s {e['f']} {e.get('target', '')}".rstrip()
                for e in events
                if e.get("type") == "nemesis" and e.get("phase") == "start"
            ],
            tracebacks=len(log_findings.tracebacks),
            unexpected_errors=len(log_findings.unexpected),
        )

    async def cleanup(self) -> None:
        """Stop and remove everything the run started (shielded: also when cancelled)."""
        with anyio.CancelScope(shield=True):
            self.busy.stop()
            if self.fleet is not None:
                await self.fleet.aclose()
            self.history.close()
            if self.quota is not None:
                self.quota.remove()
            if self.cluster is not None:
                await anyio.to_thread.run_sync(self.cluster.stop)
            if self.config.keep:
                self.show(f"kept the run's directory: {self.base}")
            else:
                base = self.base
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(base, ignore_errors=True))


async def run_nemesis(config: NemesisConfig, *, show: Callable[[str], None] = _nothing) -> Verdict:
    """One run (see the module docstring); its verdict."""
    began = time.monotonic()
    base = await anyio.to_thread.run_sync(_make_base, config.parent)
    run = _Run(
        config=config,
        base=base,
        show=show,
        history=History(base / "history.jsonl"),
        busy=BusyLoops(config.starve),
    )
    try:
        cluster = await run.start_cluster()
        async with anyio.create_task_group() as serving:
            proxies = [Proxy(name, upstream_port=cluster.port) for name in DAEMON_NAMES]
            for proxy in proxies:
                await serving.start(proxy.serve)
            try:
                fleet = await run.start_fleet(proxies)
                await run.load(cluster, fleet)
                verdict = await run.judge(cluster, fleet)
            finally:
                # the daemons stop before their proxies do (else they log the store as lost)
                with anyio.CancelScope(shield=True):
                    run.busy.stop()
                    if run.fleet is not None:
                        await run.fleet.aclose()
                serving.cancel_scope.cancel()
    finally:
        await run.cleanup()
    verdict.elapsed_s = time.monotonic() - began
    return verdict
