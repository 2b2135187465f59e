"""`hunter serve`: the daemon. One anyio task group owns everything it runs.

Lifecycle
---------
1. Take ``<root>/state/daemon.lock`` (an exclusive ``flock`` holding our pid): a second daemon on
   the same root is refused with the first one's pid (`DaemonAlreadyRunning`).
2. Open the turn store (`store.engine`: embedded SQLite, WAL, by default; or PostgreSQL,
   opened without migrating: a database not migrated, or migrated by a newer hunter, or a
   server that cannot be reached ends the start with exit 2 and a message saying which server
   and what to do, `StoreStartError`), the ledger group-commit syncer, the sandbox
   runtime, the hub.
3. Listen: the sockets systemd passed (``LISTEN_FDNAMES`` ``control`` / ``executors``), else
   create ``control.sock`` and ``executors.sock`` (a stale file is unlinked first: we hold the
   root's lock, so nobody else can be serving it), ``chmod`` them to ``socket_mode``.
4. Start, in this order, the turn core (which first recovers unfinished
   turns: interrupted attempts become CRASH faults), the hub and the control API. When both
   sockets listen (``task_status.started()`` of both servers), tell systemd ``READY=1`` and log
   ``daemon_ready``; the watchdog pings from the event loop, and STATUS= carries live counts
   (turns active and queued, executors ready) every ``metrics.status_interval_s``. With
   ``[metrics]`` set, `/metrics` is served (loopback TCP or a Unix socket) and/or written as a
   node-exporter textfile, from this same task group (docs/metrics.md).
5. Signals are handled here and only here: SIGTERM/SIGINT (or a ``drain`` request) start the
   drain; SIGHUP reloads the reloadable configuration keys. A second SIGTERM/SIGINT forces exit.
6. Drain: ``STOPPING=1``; no new sessions or turns are accepted (``draining`` errors), no new
   attempts start, and running attempts get up to ``drain_grace_s`` to finish. Then the turn
   core is cancelled: an attempt still running keeps its turn ``running`` in the store, and the
   next daemon on this root treats it as an interrupted attempt (a CRASH fault, then the
   policy). Turns waiting for a retry or not yet started simply resume after the restart. The
   hub then closes every executor connection (``executor_disconnected``, ``HUB_CLOSED``), the
   daemon logs ``daemon_stopped``, and the rest is cancelled.

Exit codes: 0 after a drain (clean or with parked attempts), 1 when a second signal forced the
exit or the daemon failed (the message and the ``daemon_failed`` log event say why), 2 for a
configuration/usage problem (including a configured PostgreSQL store that cannot be reached or is
not migrated), 3 when another daemon already serves the root.

Layout: `Daemon` here is the lifecycle above, read top to bottom in one place (the parts'
wiring, the order they start and stop in, signals, drain, reload); its start-up pieces are in
`supervisor.daemon` (the root's lock, the store opening and its `StoreStartError`, the
listeners and socket activation, the parts' settings from the configuration, the reload's
configuration, the asyncio race guard), re-exported here under their former names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread

from ledger import GroupSyncer
from supervisor.config import Config, ConfigError, config_file_for, load_config
from supervisor.control.server import ControlServer
from supervisor.daemon.listeners import Listeners, open_listeners
from supervisor.daemon.loop_races import LoopRaces, guard_loop_races
from supervisor.daemon.reload import reloaded
from supervisor.daemon.root_lock import root_lock
from supervisor.daemon.settings import (
    budget_limits,
    default_process_slots,
    hub_settings,
    make_runtime,
    retry_options,
    runtime_config_of,
    sandbox_summary,
)
from supervisor.daemon.store import (
    StoreStartError,
    connect_failure,
    fleet_of,
    open_store,
    postgres_target,
    store_start_errors,
)
from supervisor.errors import DaemonAlreadyRunning
from supervisor.executors.hub import ExecutorHub
from supervisor.feed import Feed
from supervisor.heap import settle
from supervisor.logging import configure_logging, get_logger
from supervisor.metrics import DaemonMetrics, Sources, serve_metrics, status_line, write_textfiles
from supervisor.sdnotify import (
    listen_fds,
    notify,
    status_loop,
    watchdog_interval,
    watchdog_loop,
)
from supervisor.traces import FanOut, SpanExport, TurnTraces, open_traces
from supervisor.turns.context import CoreSettings
from supervisor.turns.core import TurnCore
from supervisor.turns.sessions import RuntimeLike
from supervisor.turns.tracker import TurnEvents

__all__ = [
    "EXIT_ALREADY_RUNNING",
    "EXIT_FORCED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Daemon",
    "DaemonAlreadyRunning",
    "LoopRaces",
    "StoreStartError",
    "budget_limits",
    "connect_failure",
    "fleet_of",
    "guard_loop_races",
    "hub_settings",
    "make_runtime",
    "open_store",
    "postgres_target",
    "retry_options",
    "run_daemon",
    "runtime_config_of",
    "sandbox_summary",
    "store_start_errors",
]

EXIT_OK: Final = 0
EXIT_FORCED: Final = 1
EXIT_USAGE: Final = 2
EXIT_ALREADY_RUNNING: Final = 3
#: Worker threads for blocking calls (ledger appends waiting for their fsync, sandbox setup).
WORKER_THREADS: Final = 256


class _Stoppable:
    """A task of the daemon's task group that can be stopped alone (`stop` returns once it
    has ended): the turn core, stopped before the executors are disconnected."""

    def __init__(self, run: Callable[..., Awaitable[None]]) -> None:
        self._run = run
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            with self._scope:
                await self._run(task_status=task_status)
        finally:
            self._ended.set()

    async def stop(self) -> None:
        self._scope.cancel()
        await self._ended.wait()


class Daemon:
    """The daemon for one root. `run` returns the exit code."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        overrides: Mapping[str, object] | None = None,
        handle_signals: bool = True,
        runtime_factory: Callable[..., RuntimeLike] | None = None,
        process_slots: int | None = None,
        traces: TurnTraces | None = None,
        settle_heap: bool = False,
    ) -> None:
        self.config = config
        #: collect and freeze the start-up heap once ready (`supervisor.heap`): `hunter serve`
        #: only, never a daemon inside another program
        self._settle_heap = settle_heap
        self._config_path = config_path
        self._overrides = dict(overrides or {})
        self._handle_signals = handle_signals
        self._runtime_factory = runtime_factory or make_runtime
        self._process_slots = process_slots or default_process_slots()
        self._log = get_logger("supervisor.server")
        self._stop = anyio.Event()
        self._forced = False
        self.turn_core: TurnCore | None = None
        self.hub: ExecutorHub | None = None
        #: the daemon's Prometheus registry and event metrics (docs/metrics.md)
        self.metrics = DaemonMetrics()
        #: spans of turns (`[tracing]`; tests hand in their own, on an in-memory exporter)
        self._traces = traces
        self._span_export: SpanExport | None = None
        self.ready = anyio.Event()
        #: set after each SIGHUP reload (then replaced), for tools and tests
        self.reloaded = anyio.Event()
        self.reloads = 0
        self._races = LoopRaces()

    def request_drain(self) -> None:
        """Start the drain (as SIGTERM does)."""
        self._stop.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> int:
        config = self.config
        # Ledger appends hold a worker thread until their group fsync: allow more of them in
        # flight than anyio's default of 40 (they are blocked on I/O, not using CPU).
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, WORKER_THREADS)
        self._races = guard_loop_races()
        with root_lock(config.root):
            return await self._run_locked(config, task_status)

    async def _run_locked(self, config: Config, task_status: anyio.abc.TaskStatus[None]) -> int:

        config.runtime_dir.mkdir(parents=True, exist_ok=True)
        metrics = self.metrics
        async with open_store(config) as store:
            with GroupSyncer(observe=metrics.ledger_synced) as syncer:
                runtime = await anyio.to_thread.run_sync(
                    lambda: self._runtime_factory(
                        config,
                        syncer=syncer,
                        forbidden_sockets=(config.control_socket, config.executor_socket),
                    )
                )
                feed = Feed()
                hub = ExecutorHub(
                    settings=hub_settings(config),
                    log=get_logger("supervisor.executors.hub"),
                    feed=feed,
                )
                core = TurnCore(
                    store=store,
                    hub=hub,
                    runtime=runtime,
                    settings=CoreSettings(
                        root=config.root,
                        retry=retry_options(config),
                        retry_budget=budget_limits(config),
                        process_slots=self._process_slots,
                        default_timeout_ms=config.sandbox.default_timeout_ms,
                        lease_ms=config.store.lease_ms,
                    ),
                    events=self._events(config, metrics),
                    traced=self._traces is not None,
                    fleet=fleet_of(store),
                    fleet_poll_s=config.store.poll_ms / 1000,
                    feed=feed,
                )
                self.turn_core, self.hub = core, hub
                metrics.watch(
                    Sources(
                        core=core.statistics,
                        hub=hub.statistics,
                        store=core.store_statistics,
                        syncer=syncer.statistics,
                    )
                )
                listeners = await open_listeners(config, listen_fds())
                try:
                    return await self._serve(
                        config,
                        core=core,
                        hub=hub,
                        listeners=listeners,
                        sandbox=functools.partial(sandbox_summary, runtime, config),
                        task_status=task_status,
                    )
                finally:
                    for path in listeners.created:
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()
                    close = getattr(runtime, "close", None)
                    if callable(close):
                        close()

    def _events(self, config: Config, metrics: DaemonMetrics) -> TurnEvents:
        """The sinks of what happens to turns: the metrics, and the traces when configured."""
        if self._traces is None and config.tracing.otlp_endpoint:
            opened = open_traces(
                config.tracing.otlp_endpoint, service_name=config.tracing.service_name
            )
            if opened is not None:
                self._traces, self._span_export = opened
        return metrics if self._traces is None else FanOut(metrics, self._traces)

    async def _serve(
        self,
        config: Config,
        *,
        core: TurnCore,
        hub: ExecutorHub,
        listeners: Listeners,
        sandbox: Callable[[], Mapping[str, object]],
        task_status: anyio.abc.TaskStatus[None],
    ) -> int:
        control = ControlServer(
            turn_core=core,
            hub=hub,
            max_frame_bytes=config.executors.max_frame_bytes,
            on_drain=self.request_drain,
            info={"root": str(config.root), "control_socket": str(config.control_socket)},
            sandbox=sandbox,
            feed=core.feed,
        )
        async with anyio.create_task_group() as tg:
            if self._handle_signals:  # first, so that a signal during start-up drains cleanly
                await tg.start(self._signals, tg.cancel_scope)
            turns = _Stoppable(core.run)
            await tg.start(turns.run)
            if self._span_export is not None:
                tg.start_soon(self._span_export.run, name="span-export")
            async with listeners.executors, listeners.control:
                await tg.start(hub.serve, listeners.executors)
                await tg.start(control.serve, listeners.control)
                if watchdog_interval() is not None:
                    await tg.start(watchdog_loop)
                await self._start_metrics(tg, config, listeners)
                stats = core.statistics()
                threshold = settle() if self._settle_heap else gc.get_threshold()
                notify("READY=1", f"STATUS=serving {config.root}")
                await tg.start(
                    partial(
                        status_loop,
                        lambda: status_line(core.statistics(), hub.statistics()),
                        interval=config.metrics.status_interval_s,
                    )
                )
                self._log.info(
                    "daemon_ready",
                    root=str(config.root),
                    # the configuration file read (None: defaults and HUNTER_* variables only)
                    config_file=None if self._config_path is None else str(self._config_path),
                    control_socket=str(config.control_socket),
                    executor_socket=str(config.executor_socket),
                    pid=os.getpid(),
                    turns_recovered=stats.turns.turns_active,
                    gc_threshold=list(threshold),
                )
                self.ready.set()
                task_status.started()
                await self._stop.wait()
                self._races.stopping = True
                notify("STOPPING=1", "STATUS=draining")
                # Attempts still running after the grace period are cancelled with everything
                # else; their turns stay `running` in the store (a CRASH after restart).
                clean = await core.drain(self.config.drain_grace_s)
                # Then, in order: the turn core stops (what still runs stays `running` in the
                # store), the executors are disconnected (each `executor_disconnected`
                # logged, reason HUB_CLOSED), and only then is the daemon stopped.
                await turns.stop()
                await hub.aclose()
                self._log.info("daemon_stopped", clean=clean)
                tg.cancel_scope.cancel()
        return EXIT_FORCED if self._forced else EXIT_OK

    async def _start_metrics(
        self, tg: anyio.abc.TaskGroup, config: Config, listeners: Listeners
    ) -> None:
        """Serve `/metrics` on the metrics listener and write the textfile, when configured."""
        render = self.metrics.render
        if listeners.metrics is not None:
            await tg.start(serve_metrics, listeners.metrics, render)
            self._log.info("metrics_listening", listen=config.metrics.listen)
        if config.metrics.textfile is not None:
            await tg.start(
                partial(
                    write_textfiles,
                    config.metrics.textfile,
                    render,
                    interval_s=config.metrics.textfile_interval_s,
                )
            )

    async def _signals(
        self,
        outer: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self._reload()
                    continue
                name = signal.Signals(signum).name
                if not self._stop.is_set():
                    self._log.info("shutdown_requested", signal=name)
                    self._stop.set()
                else:
                    self._log.warning("shutdown_forced", signal=name)
                    self._forced = True
                    outer.cancel()

    async def _reload(self) -> None:
        try:
            new = await anyio.to_thread.run_sync(
                lambda: load_config(self._config_path, env=os.environ, overrides=self._overrides)
            )
        except ConfigError as exc:
            self._log.error("config_reload_failed", key=exc.key, problem=exc.problem)
            return
        applied, diff = reloaded(self.config, new)
        self.config = applied
        if any(k.startswith("log.") for k in diff.reloadable):
            configure_logging(fmt=applied.log.format, level=applied.log.level)
        if self.turn_core is not None:
            self.turn_core.settings = dataclasses.replace(
                self.turn_core.settings,
                retry=retry_options(applied),
                retry_budget=budget_limits(applied),
                default_timeout_ms=applied.sandbox.default_timeout_ms,
            )
        if self.hub is not None and any(k.startswith("executors.") for k in diff.reloadable):
            self.hub.settings = hub_settings(applied)
        self.reloads += 1
        self._log.info("config_reloaded", applied=list(diff.reloadable), reloads=self.reloads)
        if diff.restart_required:
            self._log.warning("config_reload_partial", restart_required=list(diff.restart_required))
        event, self.reloaded = self.reloaded, anyio.Event()
        event.set()


def run_daemon(
    *,
    root: Path | None,
    config_path: Path | None,
    log_format: str | None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Entry point of `hunter serve`: load config (exit 2 on error), configure logs, run."""
    overrides: dict[str, object] = {}
    if root is not None:
        overrides["root"] = root
    if log_format is not None:
        overrides["log.format"] = log_format
    env = os.environ if env is None else env
    # --config, else $HUNTER_CONFIG, else ROOT/hunter.toml if it exists (daemon_ready names it)
    config_path = config_file_for(config=config_path, root=root, env=env)
    try:
        config = load_config(config_path, env=env, overrides=overrides)
    except ConfigError as exc:
        sys.stderr.write(f"hunter serve: {exc}\n")
        return EXIT_USAGE
    configure_logging(fmt=config.log.format, level=config.log.level)
    daemon = Daemon(config, config_path=config_path, overrides=overrides, settle_heap=True)
    try:
        return anyio.run(daemon.run)
    except DaemonAlreadyRunning as exc:
        sys.stderr.write(f"hunter serve: {exc}\n")
        return EXIT_ALREADY_RUNNING
    except StoreStartError as exc:  # the configured PostgreSQL: unreachable, or not migrated
        get_logger("supervisor.server").error("daemon_failed", error=str(exc))
        sys.stderr.write(f"hunter serve: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:  # a signal before the receiver was installed
        return EXIT_FORCED
    except Exception as exc:  # start-up failed (socket path, sandbox, disk): say so, exit 1
        get_logger("supervisor.server").exception("daemon_failed", error=str(exc))
        sys.stderr.write(f"hunter serve: cannot run the daemon: {type(exc).__name__}: {exc}\n")
        return EXIT_FORCED
