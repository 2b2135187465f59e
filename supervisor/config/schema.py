"""The configuration's shape: frozen msgspec Structs, one per `[section]`, and the key table.

Every key is declared once, as an annotated field: `Annotated[type, _k(...), "meaning"] = default`.
msgspec checks the type, the bounds (`ge`, `gt`, `le`) and the choices (a `Literal`) when
`supervisor.config.loader` converts the merged sources; `_k` also records the reload rule
(`reload=True`: a SIGHUP reload applies it without a restart), how a value is parsed when it is
not plain (`kind`: an octal mode, a uid list, a DSN, a listen address) and how a computed
default is described (`default_doc`). `KEYS`, read from these annotations, drives the loader's
messages, `Config.to_dict()`, the reload diff (`supervisor.config.diff`), and
docs/configuration.md has one row per key (checked by the tests). No I/O here.
"""

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "ENV_PREFIX",
    "KEYS",
    "RELOADABLE_KEYS",
    "SECTIONS",
    "Config",
    "Enforcement",
    "ExecutorSettings",
    "Key",
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
    "value_of",
]

ENV_PREFIX: Final = "HUNTER_"

Enforcement = Literal["strict", "best-effort"]
KernelAudit = Literal["enable", "auto", "off"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
StoreEngine = Literal["sqlite", "postgres"]
Kind = Literal["path", "int", "float", "str", "mode", "uids", "dsn", "listen"]

_Uid = Annotated[int, msgspec.Meta(ge=0, le=4_294_967_294)]
#: The kind of a key whose `_k` names none, by its type (anything else is "str").
_KINDS: Final[dict[object, Kind]] = {int: "int", float: "float", Path: "path"}
#: How `Config.to_dict()` writes a value of these kinds.
_PLAIN: Final[dict[str, Callable[[Any], object]]] = {
    "path": str,
    "mode": "{:04o}".format,
    "uids": sorted,
}


def _k(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    reload: bool = False,
    kind: Kind | None = None,
    default_doc: str | None = None,
) -> msgspec.Meta:
    """A key's bounds (checked by msgspec) and its reload rule, kind and default's description."""
    extra = {"reload": reload, "kind": kind, "default_doc": default_doc}
    if gt is not None:
        return msgspec.Meta(gt=gt, le=le, extra=extra)
    return msgspec.Meta(ge=ge, le=le, extra=extra)


class _Table(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A `[section]` (or the whole file): immutable, and an unknown key is an error."""


class ExecutorSettings(_Table, frozen=True):
    """`[executors]`: the executor hub on `executors.sock` (names match `HubSettings`)."""

    max_frame_bytes: Annotated[
        int,
        _k(ge=1024, le=64 * 1024 * 1024),
        "Largest frame (length prefix excluded) accepted from an executor; a larger one closes "
        "that connection.",
    ] = 1_048_576
    heartbeat_interval_s: Annotated[
        float, _k(ge=0.01, le=3600.0, reload=True), "Seconds between heartbeats sent each way."
    ] = 5.0
    heartbeat_misses: Annotated[
        int,
        _k(ge=1, le=1000, reload=True),
        "Consecutive missed heartbeats after which an executor is OFFLINE and its in-flight "
        "instructions become CRASH faults.",
    ] = 3
    queue_capacity: Annotated[
        int,
        _k(ge=1, le=1_000_000),
        "Bounded queue length per command type; beyond it a submit gets 'queue full' with a "
        "retry-after hint.",
    ] = 1024
    queue_wait_s: Annotated[
        float,
        _k(gt=0.0, le=86_400.0, reload=True),
        "Longest time an instruction waits in the queue for a READY executor.",
    ] = 60.0
    quarantine_s: Annotated[
        float,
        _k(ge=0.0, le=604_800.0, reload=True),
        "Cool-down during which a quarantined executor id is refused.",
    ] = 300.0
    cancel_grace_s: Annotated[
        float,
        _k(gt=0.0, le=3600.0, reload=True),
        "After a deadline passes and `cancel` is sent, how long the executor has to acknowledge "
        "before it is marked ERROR.",
    ] = 2.0
    hello_timeout_s: Annotated[
        float, _k(gt=0.0, le=3600.0), "How long a new executor connection has to send `hello`."
    ] = 5.0
    breaker_faults: Annotated[
        int,
        _k(ge=0, le=1_000_000, reload=True),
        "Circuit breaker per command type: this many faults (CRASH, TIMEOUT, invalid or partial "
        "answers of its executors) within `breaker_window_s` open it, and its instructions fail "
        "fast with CIRCUIT_OPEN until a probe succeeds (0: off).",
    ] = 0
    breaker_window_s: Annotated[
        float,
        _k(ge=0.001, le=86_400.0, reload=True),
        "The window in which `breaker_faults` faults open a command type's breaker.",
    ] = 10.0
    breaker_cooldown_s: Annotated[
        float,
        _k(ge=0.001, le=86_400.0, reload=True),
        "How long an open breaker fails instructions fast before it lets one through as a probe "
        "(half-open); the probe's success closes it, its fault reopens it.",
    ] = 30.0


class RetrySettings(_Table, frozen=True):
    """`[retry]`: the attempt budget and backoff (names match `RetryOptions`)."""

    max_attempts: Annotated[
        int,
        _k(ge=1, le=100, reload=True),
        "Attempts per turn, counting the first (Phase-21 max_retries = 3).",
    ] = 3
    base_delay_ms: Annotated[
        int, _k(ge=0, le=3_600_000, reload=True), "Backoff before the second attempt."
    ] = 500
    backoff_multiplier: Annotated[
        float,
        _k(ge=1.0, le=100.0, reload=True),
        "Factor applied to the delay after each further attempt.",
    ] = 2.0
    max_delay_ms: Annotated[
        int, _k(ge=0, le=86_400_000, reload=True), "Cap on any single backoff delay."
    ] = 30_000
    jitter: Annotated[
        float,
        _k(ge=0.0, le=1.0, reload=True),
        "Random spread as a fraction of the delay (0 keeps the seed schedule exact).",
    ] = 0.0
    budget_ratio: Annotated[
        float,
        _k(ge=0.0, le=100.0, reload=True),
        "Daemon-wide retry budget: instruction retries allowed per first attempt in the window "
        "(0.2: at most one retry per five new turns, plus the minimum); a retry over budget is "
        "not scheduled and the turn ends DAEMON_RETRY_BUDGET_EXHAUSTED.",
    ] = 0.2
    budget_window_s: Annotated[
        float,
        _k(ge=0.0, le=3600.0, reload=True),
        "The retry budget's sliding window in seconds (0 turns the budget off; else at least 0.1).",
    ] = 10.0
    budget_min_retries: Annotated[
        int,
        _k(ge=0, le=1_000_000, reload=True),
        "Retries the budget allows in any window whatever the traffic (so a quiet daemon still "
        "retries).",
    ] = 100


class SandboxSettings(_Table, frozen=True):
    """`[sandbox]`: how process turns are confined, and their default limits."""

    enforcement: Annotated[
        Enforcement,
        "'strict' refuses to run a turn when a confinement mechanism (uid drop, Landlock, "
        "cgroup limits, network isolation) is unavailable; 'best-effort' runs it with the "
        "mechanisms available and records the level in the log and the evidence.",
    ] = "best-effort"
    uid_range_start: Annotated[
        int,
        _k(ge=1, le=4_294_967_294),
        "First uid used to run process turns (never root). The default lies above the ranges "
        "systemd hands to containers and dynamic users.",
    ] = 1_900_000_000
    uid_range_size: Annotated[
        int,
        _k(ge=1, le=1_000_000_000),
        "Number of uids in the turn range (one per concurrently running turn).",
    ] = 65_536
    default_timeout_ms: Annotated[
        int, _k(ge=1, le=86_400_000, reload=True), "Deadline of a process turn that names none."
    ] = 30_000
    memory_max_bytes: Annotated[
        int,
        _k(ge=1024 * 1024, le=2**50, reload=True),
        "Memory limit of one process turn (cgroup memory.max / RLIMIT_AS fallback).",
    ] = 1024 * 1024 * 1024
    pids_max: Annotated[
        int,
        _k(ge=1, le=4_194_304, reload=True),
        "Process/thread limit of one process turn (cgroup pids.max / RLIMIT_NPROC).",
    ] = 256
    output_max_bytes: Annotated[
        int,
        _k(ge=1024, le=2**50, reload=True),
        "Largest file a turn may write and largest stdout/stderr kept (RLIMIT_FSIZE).",
    ] = 64 * 1024 * 1024
    kernel_audit: Annotated[
        KernelAudit,
        "Landlock's denials (a turn's read, write or execution outside its grants) on the "
        "evidence record as capability violations, read from the kernel's audit log (Linux >= "
        "6.15; needs CAP_AUDIT_READ and CAP_AUDIT_WRITE). 'enable' turns the kernel's audit on "
        "when it is off (CAP_AUDIT_CONTROL; logged); 'auto' uses it only when it is on; 'off' "
        "never. Without it denials are still enforced, not recorded (the enforcement level "
        "'fs_denials' says which).",
    ] = "enable"
    helper_socket: Annotated[
        Path | None,
        _k(default_doc="unset (the daemon confines turns itself)"),
        "The socket of the root sandbox helper (`hunter sandbox-helper`). Set, the daemon needs "
        "no privileges: the helper builds and runs every confined attempt and promotes its "
        "outputs, the daemon keeps the ledgers (docs/operations.md, 'Privilege separation'). "
        "Unset, the daemon confines turns itself and must run as root.",
    ] = None


class LogSettings(_Table, frozen=True):
    """`[log]`: structured logging (see docs/logging.md)."""

    format: Annotated[
        LogFormat,
        _k(reload=True),
        "'json' (JSON lines, for journald), 'console' (readable), or 'auto': console on a tty, "
        "JSON otherwise.",
    ] = "auto"
    level: Annotated[LogLevel, _k(reload=True), "Lowest level written."] = "info"


class StoreSettings(_Table, frozen=True):
    """`[store]`: which turn store engine the daemon opens (see docs/operations.md)."""

    engine: Annotated[
        StoreEngine,
        "'sqlite': the embedded store in `intake_path` (one daemon); 'postgres': a PostgreSQL "
        "database named by `store.dsn`, migrated with `hunter store migrate`.",
    ] = "sqlite"
    dsn: Annotated[
        str,
        _k(kind="dsn", default_doc="unset"),
        "The PostgreSQL connection string (libpq URI or keyword string) without a password; "
        "required when engine is 'postgres'.",
    ] = ""
    password_file: Annotated[
        Path | None,
        _k(default_doc="unset"),
        "A file whose first line is the PostgreSQL password, read at start; unset means libpq's "
        "own mechanisms (PGPASSFILE, ~/.pgpass, PGPASSWORD).",
    ] = None
    pool_size: Annotated[
        int,
        _k(ge=1, le=64),
        "PostgreSQL connections kept for reads (three more: the writes, the lease renewals "
        "and LISTEN).",
    ] = 2
    lease_ms: Annotated[
        int,
        _k(ge=300, le=3_600_000),
        "How long a daemon's claim on a turn, and its home of a session, hold without a "
        "heartbeat (renewed every third of it). With several daemons on PostgreSQL this is the "
        "time before a dead or paused daemon's work is taken over.",
    ] = 30_000
    poll_ms: Annotated[
        int,
        _k(ge=10, le=60_000),
        "With several daemons on PostgreSQL: how often a daemon looks for work nobody holds "
        "when no notification woke it earlier (LISTEN/NOTIFY wakes it at once).",
    ] = 500


class MetricsSettings(_Table, frozen=True):
    """`[metrics]`: Prometheus metrics and the systemd status line (see docs/metrics.md)."""

    listen: Annotated[
        str,
        _k(kind="listen", default_doc="unset (off)"),
        "Where `/metrics` is served over HTTP: 'HOST:PORT' on a loopback address (e.g. "
        "'127.0.0.1:9464', '[::1]:9464'), or a Unix socket path (a value with a '/'). Empty: "
        "not served. There is no authentication, hence loopback or a socket only.",
    ] = ""
    textfile: Annotated[
        Path | None,
        _k(default_doc="unset"),
        "A file the metrics are written to (atomically replaced) for node-exporter's textfile "
        "collector; its name should end in '.prom'. Unset: no file.",
    ] = None
    textfile_interval_s: Annotated[
        float, _k(ge=0.1, le=3600.0), "Seconds between rewrites of `metrics.textfile`."
    ] = 15.0
    status_interval_s: Annotated[
        float,
        _k(ge=0.1, le=3600.0),
        "Seconds between updates of the systemd status line (STATUS=: turns active, queued, "
        "executors ready), sent only under systemd ($NOTIFY_SOCKET).",
    ] = 5.0


class TracingSettings(_Table, frozen=True):
    """`[tracing]`: OpenTelemetry traces of turns (the `otel` extra; see docs/operations.md)."""

    otlp_endpoint: Annotated[
        str,
        _k(default_doc="unset (off)"),
        "Where spans are sent over OTLP/HTTP (e.g. 'http://127.0.0.1:4318/v1/traces'): a span "
        "per turn and per attempt. Empty: no traces. Needs `pip install humanoid-hunter[otel]`.",
    ] = ""
    service_name: Annotated[str, "The `service.name` of the spans."] = "hunter"


class Config(_Table, frozen=True):
    """The whole daemon configuration. Paths are absolute once loaded by `load_config`."""

    root: Annotated[
        Path,
        _k(default_doc="`$STATE_DIRECTORY` under systemd, else `./.hunter`"),
        "The one root directory: packages, session ledgers, sandbox dirs, state.",
    ] = Path(".hunter")
    runtime_dir: Annotated[
        Path,
        _k(default_doc="`$RUNTIME_DIRECTORY` under systemd, else `<root>/run`"),
        "Directory for the local sockets.",
    ] = Path(".hunter/run")
    control_socket: Annotated[
        Path,
        _k(default_doc="`<runtime_dir>/control.sock`"),
        "The control API socket (ignored when systemd passes a socket named 'control').",
    ] = Path(".hunter/run/control.sock")
    executor_socket: Annotated[
        Path,
        _k(default_doc="`<runtime_dir>/executors.sock`"),
        "The executor socket (ignored when systemd passes a socket named 'executors').",
    ] = Path(".hunter/run/executors.sock")
    socket_mode: Annotated[
        int,
        _k(kind="mode", ge=0, le=0o777),
        "Permission bits of the socket files the daemon creates (octal; a string such as '0660' "
        "or an integer such as 0o660).",
    ] = 0o660
    allowed_uids: Annotated[
        frozenset[_Uid] | None,
        _k(kind="uids"),
        "Uids allowed to connect as executors (checked with SO_PEERCRED); unset means the "
        "daemon's own uid and root. In the environment: a comma-separated list.",
    ] = None
    intake_path: Annotated[
        Path,
        _k(default_doc="`<root>/state/turns.sqlite3`"),
        "The embedded turn store: sessions, turns, attempts, claims (SQLite, WAL mode).",
    ] = Path(".hunter/state/turns.sqlite3")
    drain_grace_s: Annotated[
        float,
        _k(ge=0.0, le=3600.0, reload=True),
        "On SIGTERM: how long in-flight work may finish before it is parked and the daemon "
        "exits (keep below the unit's TimeoutStopSec).",
    ] = 30.0
    executors: ExecutorSettings = ExecutorSettings()
    retry: RetrySettings = RetrySettings()
    sandbox: SandboxSettings = SandboxSettings()
    log: LogSettings = LogSettings()
    store: StoreSettings = StoreSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()

    def to_dict(self) -> dict[str, object]:
        """A plain, JSON- and TOML-friendly dict (for `hunter config show`).

        Paths become strings, `socket_mode` an octal string ("0660"), `allowed_uids` a sorted
        list (omitted when unset); unset optional keys are omitted. Feeding it back as
        `overrides` gives an equal `Config`.
        """
        out: dict[str, Any] = {}
        for key, spec in KEYS.items():
            section, _, name = key.rpartition(".")
            table = out.setdefault(section, {}) if section else out
            value: Any = value_of(self, key)
            if value is not None:
                plain = _PLAIN.get(spec.kind)
                table[name] = plain(value) if plain else value
        return out


#: The `[section]` tables: section name -> its settings Struct.
SECTIONS: Final[dict[str, type[_Table]]] = {
    "executors": ExecutorSettings,
    "retry": RetrySettings,
    "sandbox": SandboxSettings,
    "log": LogSettings,
    "store": StoreSettings,
    "metrics": MetricsSettings,
    "tracing": TracingSettings,
}


class Key(msgspec.Struct, frozen=True):
    """One key of the table, as its annotation declares it (`meta` holds the bounds)."""

    doc: str
    kind: Kind
    reload: bool
    default_doc: str | None
    choices: tuple[str, ...]
    meta: msgspec.Meta


def _key(annotation: object) -> Key:
    base, *marks = typing.get_args(annotation)  # Annotated[type, _k(...), "doc"]
    meta = next((m for m in marks if isinstance(m, msgspec.Meta)), msgspec.Meta())
    extra: dict[str, Any] = meta.extra or {}
    if isinstance(base, types.UnionType):  # `X | None`
        base = typing.get_args(base)[0]
    choices = typing.get_args(base) if typing.get_origin(base) is Literal else ()
    kind = extra.get("kind") or _KINDS.get(base, "str")
    doc = next(m for m in marks if isinstance(m, str))
    return Key(doc, kind, extra.get("reload", False), extra.get("default_doc"), choices, meta)


def iter_keys() -> list[tuple[str, Key]]:
    """Every key as (dotted name, its `Key`), in documentation order."""
    keys: list[tuple[str, Key]] = []
    for name, annotation in Config.__annotations__.items():
        if name in SECTIONS:
            section = SECTIONS[name].__annotations__.items()
            keys.extend((f"{name}.{sub}", _key(a)) for sub, a in section)
        else:
            keys.append((name, _key(annotation)))
    return keys


def env_var_name(dotted_key: str) -> str:
    """The environment variable for a dotted key: `executors.queue_wait_s` ->
    `HUNTER_EXECUTORS__QUEUE_WAIT_S`."""
    return ENV_PREFIX + dotted_key.replace(".", "__").upper()


def value_of(config: Config, key: str) -> object:
    """The value of a dotted key in `config`."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(config, section) if section else config, name)


#: Every key by dotted name (the loader, the reload diff and `to_dict` look keys up here).
KEYS: Final = dict(iter_keys())
RELOADABLE_KEYS: Final = frozenset(k for k, spec in KEYS.items() if spec.reload)
