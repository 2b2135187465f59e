"""The configuration's shape: the typed settings dataclasses and the key table they declare.

Every key is declared once, as a dataclass field whose metadata carries `doc` (meaning), `kind`
(how a value is parsed), optional `min`, `max`, `choices`, `reload` (True when a SIGHUP reload
applies it without a restart), and `default_doc` (how a computed default is described). That table
drives parsing and validation (`supervisor.config.loader`), `Config.to_dict()`, the reload diff
(`supervisor.config.diff`), and docs/configuration.md has one row per key (checked by the tests).
No I/O here.

About 670 lines, past the usual 600: it is the one table of every configuration key (one
dataclass per `[section]`, each field with its documentation, bounds and reload rule); split
by section it would scatter the table that docs/configuration.md and its test mirror.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, cast

__all__ = [
    "ENV_PREFIX",
    "FIELDS",
    "RELOADABLE_KEYS",
    "SECTIONS",
    "Config",
    "Enforcement",
    "ExecutorSettings",
    "LogFormat",
    "LogLevel",
    "LogSettings",
    "MetricsSettings",
    "RetrySettings",
    "SandboxSettings",
    "StoreEngine",
    "StoreSettings",
    "TracingSettings",
    "env_var_name",
    "iter_keys",
]

ENV_PREFIX: Final = "HUNTER_"

Enforcement = Literal["strict", "best-effort"]
KernelAudit = Literal["enable", "auto", "off"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
StoreEngine = Literal["sqlite", "postgres"]


# --- the key table ------------------------------------------------------------------------------
# Each field carries metadata: `doc` (meaning), `kind` (how a value is parsed), optional `min`,
# `max`, `choices`, `reload` (True when a SIGHUP reload applies it without a restart), and
# `default_doc` (how a computed default is described).

_Kind = Literal["path", "int", "float", "str", "mode", "uids", "dsn", "listen"]


def _meta(
    *,
    doc: str,
    kind: _Kind,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_min: bool = False,
    choices: tuple[str, ...] = (),
    reload: bool = False,
    default_doc: str | None = None,
) -> dict[str, object]:
    meta: dict[str, object] = {
        "doc": doc,
        "kind": kind,
        "min": minimum,
        "max": maximum,
        "exclusive_min": exclusive_min,
        "choices": choices,
        "reload": reload,
        "default_doc": default_doc,
    }
    return meta


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorSettings:
    """`[executors]`: the executor hub on `executors.sock` (names match `HubSettings`)."""

    max_frame_bytes: int = field(
        default=1_048_576,
        metadata=_meta(
            doc="Largest frame (length prefix excluded) accepted from an executor; a larger one "
            "closes that connection.",
            kind="int",
            minimum=1024,
            maximum=64 * 1024 * 1024,
        ),
    )
    heartbeat_interval_s: float = field(
        default=5.0,
        metadata=_meta(
            doc="Seconds between heartbeats sent each way.",
            kind="float",
            minimum=0.01,
            maximum=3600.0,
            reload=True,
        ),
    )
    heartbeat_misses: int = field(
        default=3,
        metadata=_meta(
            doc="Consecutive missed heartbeats after which an executor is OFFLINE and its "
            "in-flight instructions become CRASH faults.",
            kind="int",
            minimum=1,
            maximum=1000,
            reload=True,
        ),
    )
    queue_capacity: int = field(
        default=1024,
        metadata=_meta(
            doc="Bounded queue length per command type; beyond it a submit gets 'queue full' "
            "with a retry-after hint.",
            kind="int",
            minimum=1,
            maximum=1_000_000,
        ),
    )
    queue_wait_s: float = field(
        default=60.0,
        metadata=_meta(
            doc="Longest time an instruction waits in the queue for a READY executor.",
            kind="float",
            minimum=0.0,
            exclusive_min=True,
            maximum=86_400.0,
            reload=True,
        ),
    )
    quarantine_s: float = field(
        default=300.0,
        metadata=_meta(
            doc="Cool-down during which a quarantined executor id is refused.",
            kind="float",
            minimum=0.0,
            maximum=604_800.0,
            reload=True,
        ),
    )
    cancel_grace_s: float = field(
        default=2.0,
        metadata=_meta(
            doc="After a deadline passes and `cancel` is sent, how long the executor has to "
            "acknowledge before it is marked ERROR.",
            kind="float",
            minimum=0.0,
            exclusive_min=True,
            maximum=3600.0,
            reload=True,
        ),
    )
    hello_timeout_s: float = field(
        default=5.0,
        metadata=_meta(
            doc="How long a new executor connection has to send `hello`.",
            kind="float",
            minimum=0.0,
            exclusive_min=True,
            maximum=3600.0,
        ),
    )
    breaker_faults: int = field(
        default=0,
        metadata=_meta(
            doc="Circuit breaker per command type: this many faults (CRASH, TIMEOUT, invalid or "
            "partial answers of its executors) within `breaker_window_s` open it, and its "
            "instructions fail fast with CIRCUIT_OPEN until a probe succeeds (0: off).",
            kind="int",
            minimum=0,
            maximum=1_000_000,
            reload=True,
        ),
    )
    breaker_window_s: float = field(
        default=10.0,
        metadata=_meta(
            doc="The window in which `breaker_faults` faults open a command type's breaker.",
            kind="float",
            minimum=0.001,
            maximum=86_400.0,
            reload=True,
        ),
    )
    breaker_cooldown_s: float = field(
        default=30.0,
        metadata=_meta(
            doc="How long an open breaker fails instructions fast before it lets one through "
            "as a probe (half-open); the probe's success closes it, its fault reopens it.",
            kind="float",
            minimum=0.001,
            maximum=86_400.0,
            reload=True,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrySettings:
    """`[retry]`: the attempt budget and backoff (names match `RetryOptions`)."""

    max_attempts: int = field(
        default=3,
        metadata=_meta(
            doc="Attempts per turn, counting the first (Phase-21 max_retries = 3).",
            kind="int",
            minimum=1,
            maximum=100,
            reload=True,
        ),
    )
    base_delay_ms: int = field(
        default=500,
        metadata=_meta(
            doc="Backoff before the second attempt.",
            kind="int",
            minimum=0,
            maximum=3_600_000,
            reload=True,
        ),
    )
    backoff_multiplier: float = field(
        default=2.0,
        metadata=_meta(
            doc="Factor applied to the delay after each further attempt.",
            kind="float",
            minimum=1.0,
            maximum=100.0,
            reload=True,
        ),
    )
    max_delay_ms: int = field(
        default=30_000,
        metadata=_meta(
            doc="Cap on any single backoff delay.",
            kind="int",
            minimum=0,
            maximum=86_400_000,
            reload=True,
        ),
    )
    jitter: float = field(
        default=0.0,
        metadata=_meta(
            doc="Random spread as a fraction of the delay (0 keeps the seed schedule exact).",
            kind="float",
            minimum=0.0,
            maximum=1.0,
            reload=True,
        ),
    )
    budget_ratio: float = field(
        default=0.2,
        metadata=_meta(
            doc="Daemon-wide retry budget: instruction retries allowed per first attempt in the "
            "window (0.2: at most one retry per five new turns, plus the minimum); a retry "
            "over budget is not scheduled and the turn ends DAEMON_RETRY_BUDGET_EXHAUSTED.",
            kind="float",
            minimum=0.0,
            maximum=100.0,
            reload=True,
        ),
    )
    budget_window_s: float = field(
        default=10.0,
        metadata=_meta(
            doc="The retry budget's sliding window in seconds (0 turns the budget off; else at "
            "least 0.1).",
            kind="float",
            minimum=0.0,
            maximum=3600.0,
            reload=True,
        ),
    )
    budget_min_retries: int = field(
        default=100,
        metadata=_meta(
            doc="Retries the budget allows in any window whatever the traffic (so a quiet "
            "daemon still retries).",
            kind="int",
            minimum=0,
            maximum=1_000_000,
            reload=True,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSettings:
    """`[sandbox]`: how process turns are confined, and their default limits."""

    enforcement: Enforcement = field(
        default="best-effort",
        metadata=_meta(
            doc="'strict' refuses to run a turn when a confinement mechanism (uid drop, "
            "Landlock, cgroup limits, network isolation) is unavailable; 'best-effort' runs it "
            "with the mechanisms available and records the level in the log and the evidence.",
            kind="str",
            choices=("strict", "best-effort"),
        ),
    )
    uid_range_start: int = field(
        default=1_900_000_000,
        metadata=_meta(
            doc="First uid used to run process turns (never root). The default lies above the "
            "ranges systemd hands to containers and dynamic users.",
            kind="int",
            minimum=1,
            maximum=4_294_967_294,
        ),
    )
    uid_range_size: int = field(
        default=65_536,
        metadata=_meta(
            doc="Number of uids in the turn range (one per concurrently running turn).",
            kind="int",
            minimum=1,
            maximum=1_000_000_000,
        ),
    )
    default_timeout_ms: int = field(
        default=30_000,
        metadata=_meta(
            doc="Deadline of a process turn that names none.",
            kind="int",
            minimum=1,
            maximum=86_400_000,
            reload=True,
        ),
    )
    memory_max_bytes: int = field(
        default=1024 * 1024 * 1024,
        metadata=_meta(
            doc="Memory limit of one process turn (cgroup memory.max / RLIMIT_AS fallback).",
            kind="int",
            minimum=1024 * 1024,
            maximum=2**50,
            reload=True,
        ),
    )
    pids_max: int = field(
        default=256,
        metadata=_meta(
            doc="Process/thread limit of one process turn (cgroup pids.max / RLIMIT_NPROC).",
            kind="int",
            minimum=1,
            maximum=4_194_304,
            reload=True,
        ),
    )
    output_max_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_meta(
            doc="Largest file a turn may write and largest stdout/stderr kept (RLIMIT_FSIZE).",
            kind="int",
            minimum=1024,
            maximum=2**50,
            reload=True,
        ),
    )
    kernel_audit: KernelAudit = field(
        default="enable",
        metadata=_meta(
            doc="Landlock's denials (a turn's read, write or execution outside its grants) on "
            "the evidence record as capability violations, read from the kernel's audit log "
            "(Linux >= 6.15; needs CAP_AUDIT_READ and CAP_AUDIT_WRITE). 'enable' turns the "
            "kernel's audit on when it is off (CAP_AUDIT_CONTROL; logged); 'auto' uses it only "
            "when it is on; 'off' never. Without it denials are still enforced, not recorded "
            "(the enforcement level 'fs_denials' says which).",
            kind="str",
            choices=("enable", "auto", "off"),
        ),
    )
    helper_socket: Path | None = field(
        default=None,
        metadata=_meta(
            doc="The socket of the root sandbox helper (`hunter sandbox-helper`). Set, the daemon "
            "needs no privileges: the helper builds and runs every confined attempt and "
            "promotes its outputs, the daemon keeps the ledgers (docs/operations.md, 'Privilege "
            "separation'). Unset, the daemon confines turns itself and must run as root.",
            kind="path",
            default_doc="unset (the daemon confines turns itself)",
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """`[log]`: structured logging (see docs/logging.md)."""

    format: LogFormat = field(
        default="auto",
        metadata=_meta(
            doc="'json' (JSON lines, for journald), 'console' (readable), or 'auto': console "
            "on a tty, JSON otherwise.",
            kind="str",
            choices=("auto", "json", "console"),
            reload=True,
        ),
    )
    level: LogLevel = field(
        default="info",
        metadata=_meta(
            doc="Lowest level written.",
            kind="str",
            choices=("debug", "info", "warning", "error", "critical"),
            reload=True,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSettings:
    """`[store]`: which turn store engine the daemon opens (see docs/operations.md)."""

    engine: StoreEngine = field(
        default="sqlite",
        metadata=_meta(
            doc="'sqlite': the embedded store in `intake_path` (one daemon); 'postgres': a "
            "PostgreSQL database named by `store.dsn`, migrated with `hunter store migrate`.",
            kind="str",
            choices=("sqlite", "postgres"),
        ),
    )
    dsn: str = field(
        default="",
        metadata=_meta(
            doc="The PostgreSQL connection string (libpq URI or keyword string) without a "
            "password; required when engine is 'postgres'.",
            kind="dsn",
            default_doc="unset",
        ),
    )
    password_file: Path | None = field(
        default=None,
        metadata=_meta(
            doc="A file whose first line is the PostgreSQL password, read at start; unset means "
            "libpq's own mechanisms (PGPASSFILE, ~/.pgpass, PGPASSWORD).",
            kind="path",
            default_doc="unset",
        ),
    )
    pool_size: int = field(
        default=2,
        metadata=_meta(
            doc="PostgreSQL connections kept for reads (the writes use one more).",
            kind="int",
            minimum=1,
            maximum=64,
        ),
    )
    lease_ms: int = field(
        default=30_000,
        metadata=_meta(
            doc="How long a daemon's claim on a turn, and its home of a session, hold without a "
            "heartbeat (renewed every third of it). With several daemons on PostgreSQL this is "
            "the time before a dead or paused daemon's work is taken over.",
            kind="int",
            minimum=300,
            maximum=3_600_000,
        ),
    )
    poll_ms: int = field(
        default=500,
        metadata=_meta(
            doc="With several daemons on PostgreSQL: how often a daemon looks for work nobody "
            "holds when no notification woke it earlier (LISTEN/NOTIFY wakes it at once).",
            kind="int",
            minimum=10,
            maximum=60_000,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSettings:
    """`[metrics]`: Prometheus metrics and the systemd status line (see docs/metrics.md)."""

    listen: str = field(
        default="",
        metadata=_meta(
            doc="Where `/metrics` is served over HTTP: 'HOST:PORT' on a loopback address "
            "(e.g. '127.0.0.1:9464', '[::1]:9464'), or a Unix socket path (a value with a '/'). "
            "Empty: not served. There is no authentication, hence loopback or a socket only.",
            kind="listen",
            default_doc="unset (off)",
        ),
    )
    textfile: Path | None = field(
        default=None,
        metadata=_meta(
            doc="A file the metrics are written to (atomically replaced) for node-exporter's "
            "textfile collector; its name should end in '.prom'. Unset: no file.",
            kind="path",
            default_doc="unset",
        ),
    )
    textfile_interval_s: float = field(
        default=15.0,
        metadata=_meta(
            doc="Seconds between rewrites of `metrics.textfile`.",
            kind="float",
            minimum=0.1,
            maximum=3600.0,
        ),
    )
    status_interval_s: float = field(
        default=5.0,
        metadata=_meta(
            doc="Seconds between updates of the systemd status line (STATUS=: turns active, "
            "queued, executors ready), sent only under systemd ($NOTIFY_SOCKET).",
            kind="float",
            minimum=0.1,
            maximum=3600.0,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingSettings:
    """`[tracing]`: OpenTelemetry traces of turns (the `otel` extra; see docs/operations.md)."""

    otlp_endpoint: str = field(
        default="",
        metadata=_meta(
            doc="Where spans are sent over OTLP/HTTP (e.g. 'http://127.0.0.1:4318/v1/traces'): "
            "a span per turn and per attempt. Empty: no traces. Needs `pip install "
            "humanoid-hunter[otel]`.",
            kind="str",
            default_doc="unset (off)",
        ),
    )
    service_name: str = field(
        default="hunter",
        metadata=_meta(doc="The `service.name` of the spans.", kind="str"),
    )


#: The `[section]` tables: section name -> its settings dataclass.
SECTIONS: Final[dict[str, type]] = {
    "executors": ExecutorSettings,
    "retry": RetrySettings,
    "sandbox": SandboxSettings,
    "log": LogSettings,
    "store": StoreSettings,
    "metrics": MetricsSettings,
    "tracing": TracingSettings,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole daemon configuration. Paths are absolute once loaded by `load_config`."""

    root: Path = field(
        default=Path(".hunter"),
        metadata=_meta(
            doc="The one root directory: packages, session ledgers, sandbox dirs, state.",
            kind="path",
            default_doc="`$STATE_DIRECTORY` under systemd, else `./.hunter`",
        ),
    )
    runtime_dir: Path = field(
        default=Path(".hunter/run"),
        metadata=_meta(
            doc="Directory for the local sockets.",
            kind="path",
            default_doc="`$RUNTIME_DIRECTORY` under systemd, else `<root>/run`",
        ),
    )
    control_socket: Path = field(
        default=Path(".hunter/run/control.sock"),
        metadata=_meta(
            doc="The control API socket (ignored when systemd passes a socket named 'control').",
            kind="path",
            default_doc="`<runtime_dir>/control.sock`",
        ),
    )
    executor_socket: Path = field(
        default=Path(".hunter/run/executors.sock"),
        metadata=_meta(
            doc="The executor socket (ignored when systemd passes a socket named 'executors').",
            kind="path",
            default_doc="`<runtime_dir>/executors.sock`",
        ),
    )
    socket_mode: int = field(
        default=0o660,
        metadata=_meta(
            doc="Permission bits of the socket files the daemon creates (octal; a string such "
            "as '0660' or an integer such as 0o660).",
            kind="mode",
            minimum=0,
            maximum=0o777,
        ),
    )
    allowed_uids: frozenset[int] | None = field(
        default=None,
        metadata=_meta(
            doc="Uids allowed to connect as executors (checked with SO_PEERCRED); unset means "
            "the daemon's own uid and root. In the environment: a comma-separated list.",
            kind="uids",
        ),
    )
    intake_path: Path = field(
        default=Path(".hunter/state/turns.sqlite3"),
        metadata=_meta(
            doc="The embedded turn store: sessions, turns, attempts, claims (SQLite, WAL mode).",
            kind="path",
            default_doc="`<root>/state/turns.sqlite3`",
        ),
    )
    drain_grace_s: float = field(
        default=30.0,
        metadata=_meta(
            doc="On SIGTERM: how long in-flight work may finish before it is parked and the "
            "daemon exits (keep below the unit's TimeoutStopSec).",
            kind="float",
            minimum=0.0,
            maximum=3600.0,
            reload=True,
        ),
    )
    executors: ExecutorSettings = field(default_factory=ExecutorSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    log: LogSettings = field(default_factory=LogSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)

    def to_dict(self) -> dict[str, object]:
        """A plain, JSON- and TOML-friendly dict (for `hunter config show`).

        Paths become strings, `socket_mode` an octal string ("0660"), `allowed_uids` a sorted
        list (omitted when unset); unset optional keys are omitted. Feeding it back as
        `overrides` gives an equal `Config`.
        """
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in SECTIONS:
                out[f.name] = {
                    g.name: _plain(g, getattr(value, g.name))
                    for g in dataclasses.fields(value)
                    if getattr(value, g.name) is not None
                }
            elif value is not None:
                out[f.name] = _plain(f, value)
        return out


def _plain(f: dataclasses.Field[object], value: object) -> object:
    kind = f.metadata["kind"]
    if kind == "path":
        return str(value)
    if kind == "mode":
        return f"{cast('int', value):04o}"
    if kind == "uids":
        return sorted(cast("frozenset[int]", value))
    return value


# --- keys and env names -------------------------------------------------------------------------


def iter_keys() -> list[tuple[str, dataclasses.Field[object]]]:
    """Every key as (dotted name, dataclass field), in documentation order."""
    keys: list[tuple[str, dataclasses.Field[object]]] = []
    for f in dataclasses.fields(Config):
        if f.name in SECTIONS:
            keys.extend((f"{f.name}.{g.name}", g) for g in dataclasses.fields(SECTIONS[f.name]))
        else:
            keys.append((f.name, f))
    return keys


def env_var_name(dotted_key: str) -> str:
    """The environment variable for a dotted key: `executors.queue_wait_s` ->
    `HUNTER_EXECUTORS__QUEUE_WAIT_S`."""
    return ENV_PREFIX + dotted_key.replace(".", "__").upper()


#: Every key's field by dotted name (parsing, validation and the reload diff look keys up here).
FIELDS: Final = dict(iter_keys())
RELOADABLE_KEYS: Final = frozenset(k for k, f in FIELDS.items() if f.metadata["reload"])
