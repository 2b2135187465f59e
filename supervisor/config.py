"""Daemon configuration: one frozen `Config`, loaded from TOML and `HUNTER_*` variables.

Precedence, lowest first:

1. built-in defaults (the embedded root `./.hunter`);
2. systemd's `$STATE_DIRECTORY` / `$RUNTIME_DIRECTORY` (defaults for `root` / `runtime_dir`);
3. the TOML file (`--config FILE`, else `$HUNTER_CONFIG`, else none);
4. `HUNTER_*` environment variables: `HUNTER_<KEY>` for a top-level key and
   `HUNTER_<SECTION>__<KEY>` (two underscores) for a key in a section, e.g. `HUNTER_ROOT`,
   `HUNTER_LOG__FORMAT`, `HUNTER_EXECUTORS__HEARTBEAT_INTERVAL_S`;
5. explicit overrides (command-line flags such as `--root` and `--log-format`).

Every key is declared once, below, with its type, default, bounds, meaning and whether a SIGHUP
reload applies it; that table drives parsing, validation, `Config.to_dict()` and
`diff_reloadable()`, and docs/configuration.md has one row per key (checked by the tests).
`add_parser()` registers `hunter config show|check`.
Any problem (unknown key, wrong type, out of range, unreadable or invalid TOML) raises
`ConfigError` naming the dotted key and the problem; the CLI turns it into exit code 2 before
anything starts. Relative paths are taken relative to the current directory and made absolute
when loaded. This module does file I/O only in `load_config` (reading the one TOML file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from supervisor.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "RELOADABLE_KEYS",
    "RESERVED_ENV",
    "Config",
    "ConfigDiff",
    "ConfigError",
    "ExecutorSettings",
    "LogSettings",
    "RetrySettings",
    "SandboxSettings",
    "add_parser",
    "changed_keys",
    "diff_reloadable",
    "env_var_name",
    "iter_keys",
    "load_config",
    "to_toml",
]

ENV_PREFIX: Final = "HUNTER_"
# `HUNTER_*` names the product uses for other things (so they are not rejected as unknown):
# the config file, the chaos executor's behaviour, and what the sandbox sets for a turn.
RESERVED_ENV: Final = frozenset(
    {
        "HUNTER_CONFIG",
        "HUNTER_CHAOS",
        "HUNTER_SESSION_ID",
        "HUNTER_TURN_NUMBER",
        "HUNTER_OUTPUT_DIR",
    }
)

Enforcement = Literal["strict", "best-effort"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


# --- the key table ------------------------------------------------------------------------------
# Each field carries metadata: `doc` (meaning), `kind` (how a value is parsed), optional `min`,
# `max`, `choices`, `reload` (True when a SIGHUP reload applies it without a restart), and
# `default_doc` (how a computed default is described).

_Kind = Literal["path", "int", "float", "str", "mode", "uids"]


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


_SECTIONS: Final[dict[str, type]] = {
    "executors": ExecutorSettings,
    "retry": RetrySettings,
    "sandbox": SandboxSettings,
    "log": LogSettings,
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

    def to_dict(self) -> dict[str, object]:
        """A plain, JSON- and TOML-friendly dict (for `hunter config show`).

        Paths become strings, `socket_mode` an octal string ("0660"), `allowed_uids` a sorted
        list (omitted when unset). Feeding it back as `overrides` gives an equal `Config`.
        """
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _SECTIONS:
                out[f.name] = {
                    g.name: _plain(g, getattr(value, g.name)) for g in dataclasses.fields(value)
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


# --- keys, env names, reload ---------------------------------------------------------------------


def iter_keys() -> list[tuple[str, dataclasses.Field[object]]]:
    """Every key as (dotted name, dataclass field), in documentation order."""
    keys: list[tuple[str, dataclasses.Field[object]]] = []
    for f in dataclasses.fields(Config):
        if f.name in _SECTIONS:
            keys.extend((f"{f.name}.{g.name}", g) for g in dataclasses.fields(_SECTIONS[f.name]))
        else:
            keys.append((f.name, f))
    return keys


def env_var_name(dotted_key: str) -> str:
    """The environment variable for a dotted key: `executors.queue_wait_s` ->
    `HUNTER_EXECUTORS__QUEUE_WAIT_S`."""
    return ENV_PREFIX + dotted_key.replace(".", "__").upper()


_FIELDS: Final = dict(iter_keys())
RELOADABLE_KEYS: Final = frozenset(k for k, f in _FIELDS.items() if f.metadata["reload"])


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """What changed between two configs, split by whether a SIGHUP reload can apply it."""

    reloadable: tuple[str, ...]
    restart_required: tuple[str, ...]

    @property
    def changed(self) -> tuple[str, ...]:
        """Every changed dotted key, sorted."""
        return tuple(sorted(self.reloadable + self.restart_required))


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ, in documentation order."""
    old_d, new_d = _flatten(old), _flatten(new)
    return tuple(k for k in _FIELDS if old_d[k] != new_d[k])


def diff_reloadable(old: Config, new: Config) -> ConfigDiff:
    """Split the changed keys into those a reload applies and those that need a restart.

    The daemon applies `reloadable` keys on SIGHUP and logs `restart_required` ones
    (`config_reload_partial`), keeping their old values until the next start.
    """
    changed = changed_keys(old, new)
    return ConfigDiff(
        reloadable=tuple(k for k in changed if k in RELOADABLE_KEYS),
        restart_required=tuple(k for k in changed if k not in RELOADABLE_KEYS),
    )


def _flatten(config: Config) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in _FIELDS:
        section, _, name = key.rpartition(".")
        holder: object = getattr(config, section) if section else config
        out[key] = getattr(holder, name)
    return out


# --- loading -------------------------------------------------------------------------------------

_TOML_LINE = re.compile(r"at line (\d+)")


def load_config(
    path: Path | None,
    *,
    env: Mapping[str, str],
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Build the `Config` from defaults, systemd's directories, the TOML file, `HUNTER_*`
    variables in `env`, and `overrides` (dotted keys, e.g. `{"root": ..., "log.format": ...}`,
    or nested section dicts as `Config.to_dict()` gives them), in that order of precedence.

    With `path=None` the file named by `$HUNTER_CONFIG` is read, if set. Raises `ConfigError`.
    """
    values: dict[str, tuple[object, str]] = {}  # dotted key -> (raw value, source)

    if path is None and env.get("HUNTER_CONFIG"):
        path = Path(env["HUNTER_CONFIG"])
    if path is not None:
        for key, value in _flatten_raw(_read_toml(path), source=str(path)).items():
            values[key] = (value, str(path))

    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        values[_env_key(name)] = (text, name)

    if overrides:
        for key, value in _flatten_raw(overrides, source="override").items():
            if value is not None:
                values[key] = (value, "override")

    parsed: dict[str, object] = {}
    for key, (raw, source) in values.items():
        parsed[key] = _parse(key, _FIELDS[key], raw, source)

    return _build(parsed, env)


def _read_toml(path: Path) -> dict[str, object]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            "(file)", f"cannot read {path}: {exc.strerror}", source=str(path)
        ) from exc
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError("(file)", f"{path} is not UTF-8 text", source=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_LINE.search(str(exc))
        line = int(match.group(1)) if match else None
        raise ConfigError(
            "(file)", f"invalid TOML in {path}: {exc}", source=str(path), line=line
        ) from exc


def _flatten_raw(data: Mapping[str, object], *, source: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in data.items():
        if name in _SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(name, "must be a table (section)", source=source)
            for sub, subvalue in cast("Mapping[str, object]", value).items():
                key = f"{name}.{sub}"
                if key not in _FIELDS:
                    raise ConfigError(key, "unknown key", source=source)
                out[key] = subvalue
        elif name in _FIELDS:
            out[name] = value
        else:
            raise ConfigError(name, "unknown key", source=source)
    return out


def _env_key(name: str) -> str:
    rest = name[len(ENV_PREFIX) :].lower()
    section, sep, sub = rest.partition("__")
    key = f"{section}.{sub}" if sep else rest
    if key in _FIELDS and (sep or key not in _SECTIONS):
        return key
    hint = ""
    for candidate in _FIELDS:
        if candidate.replace(".", "_") == rest:
            hint = f"; did you mean {env_var_name(candidate)}?"
            break
    raise ConfigError(
        key,
        f"unknown environment variable {name} (HUNTER_<KEY> or HUNTER_<SECTION>__<KEY>){hint}",
        source=name,
    )


def _parse(key: str, f: dataclasses.Field[object], raw: object, source: str) -> object:
    kind = f.metadata["kind"]
    from_env = source.startswith(ENV_PREFIX)
    parser = _PARSERS[kind]
    value = parser(key, raw, source, from_env)
    _check_range(key, f, value, source)
    return value


def _wrong(key: str, expected: str, raw: object, source: str) -> ConfigError:
    return ConfigError(key, f"expected {expected}, got {raw!r}", source=source)


def _parse_path(key: str, raw: object, source: str, from_env: bool) -> object:
    if isinstance(raw, Path):
        raw = str(raw)
    if not isinstance(raw, str) or not raw:
        raise _wrong(key, "a non-empty path string", raw, source)
    if "\0" in raw:
        raise ConfigError(key, "path contains a NUL byte", source=source)
    return Path(raw)


def _parse_int(key: str, raw: object, source: str, from_env: bool) -> object:
    if from_env and isinstance(raw, str):
        try:
            return int(raw.strip().replace("_", ""), 10)
        except ValueError:
            raise _wrong(key, "an integer", raw, source) from None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _wrong(key, "an integer", raw, source)
    return raw


def _parse_float(key: str, raw: object, source: str, from_env: bool) -> object:
    if from_env and isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            raise _wrong(key, "a number", raw, source) from None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise _wrong(key, "a number", raw, source)
    value = float(raw)
    if not math.isfinite(value):
        raise _wrong(key, "a finite number", raw, source)
    return value


def _parse_str(key: str, raw: object, source: str, from_env: bool) -> object:
    if not isinstance(raw, str):
        raise _wrong(key, "a string", raw, source)
    return raw.strip().lower() if from_env else raw


def _parse_mode(key: str, raw: object, source: str, from_env: bool) -> object:
    if isinstance(raw, str):
        text = raw.strip().lower().removeprefix("0o")
        if not text or any(c not in "01234567" for c in text):
            raise _wrong(key, "an octal mode such as '0660'", raw, source)
        return int(text, 8)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _wrong(key, "an octal mode such as '0660' or 0o660", raw, source)
    return raw


def _parse_uids(key: str, raw: object, source: str, from_env: bool) -> object:
    items: list[object]
    if isinstance(raw, str):
        try:
            items = [int(part, 10) for part in raw.replace(" ", "").split(",") if part]
        except ValueError:
            raise _wrong(key, "a comma-separated list of uids", raw, source) from None
    elif isinstance(raw, list | tuple | set | frozenset):
        items = list(cast("list[object]", list(raw)))
    else:
        raise _wrong(key, "a list of uids", raw, source)
    uids: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 4_294_967_294:
            raise _wrong(key, "uids between 0 and 4294967294", item, source)
        uids.add(item)
    return frozenset(uids)


_PARSERS: Final[dict[str, Callable[[str, object, str, bool], object]]] = {
    "path": _parse_path,
    "int": _parse_int,
    "float": _parse_float,
    "str": _parse_str,
    "mode": _parse_mode,
    "uids": _parse_uids,
}


def _check_range(key: str, f: dataclasses.Field[object], value: object, source: str) -> None:
    meta = f.metadata
    choices: tuple[str, ...] = meta["choices"]
    if choices and value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ConfigError(key, f"must be one of {options}, got {value!r}", source=source)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    low: float | None = meta["min"]
    high: float | None = meta["max"]
    shown = f"{value:04o}" if meta["kind"] == "mode" else repr(value)
    if low is not None and (value <= low if meta["exclusive_min"] else value < low):
        op = ">" if meta["exclusive_min"] else ">="
        bound = f"{int(low):04o}" if meta["kind"] == "mode" else _num(low)
        raise ConfigError(key, f"must be {op} {bound}, got {shown}", source=source)
    if high is not None and value > high:
        bound = f"{int(high):04o}" if meta["kind"] == "mode" else _num(high)
        raise ConfigError(key, f"must be <= {bound}, got {shown}", source=source)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _first_dir(value: str | None) -> Path | None:
    # systemd joins several directories (StateDirectory=a b) with ':'; the first is ours.
    if not value:
        return None
    first = value.split(":", 1)[0]
    return Path(first) if first else None


def _build(parsed: Mapping[str, object], env: Mapping[str, str]) -> Config:
    def absolute(p: object) -> Path:
        return Path(os.path.abspath(cast("Path", p)))

    root = absolute(parsed.get("root") or _first_dir(env.get("STATE_DIRECTORY")) or Path(".hunter"))
    runtime = absolute(
        parsed.get("runtime_dir") or _first_dir(env.get("RUNTIME_DIRECTORY")) or root / "run"
    )
    top: dict[str, object] = {
        "root": root,
        "runtime_dir": runtime,
        "control_socket": absolute(parsed.get("control_socket") or runtime / "control.sock"),
        "executor_socket": absolute(parsed.get("executor_socket") or runtime / "executors.sock"),
        "intake_path": absolute(parsed.get("intake_path") or root / "state" / "turns.sqlite3"),
    }
    for key in ("socket_mode", "allowed_uids", "drain_grace_s"):
        if key in parsed:
            top[key] = parsed[key]
    for section, cls in _SECTIONS.items():
        kwargs = {k.partition(".")[2]: v for k, v in parsed.items() if k.startswith(f"{section}.")}
        top[section] = cls(**kwargs)
    config = Config(**top)  # type: ignore[arg-type]  # keys were validated against the fields
    _check_consistency(config)
    return config


def _check_consistency(config: Config) -> None:
    if config.control_socket == config.executor_socket:
        raise ConfigError(
            "executor_socket", f"must differ from control_socket ({config.control_socket})"
        )
    r = config.retry
    if r.max_delay_ms < r.base_delay_ms:
        raise ConfigError(
            "retry.max_delay_ms",
            f"must be >= retry.base_delay_ms ({r.base_delay_ms}), got {r.max_delay_ms}",
        )
    s = config.sandbox
    if s.uid_range_start + s.uid_range_size - 1 > 4_294_967_294:
        raise ConfigError(
            "sandbox.uid_range_size",
            f"range starting at {s.uid_range_start} must end at or below uid 4294967294",
        )
    for key, path in (
        ("control_socket", config.control_socket),
        ("executor_socket", config.executor_socket),
    ):
        # sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
        if len(os.fsencode(path)) > 107:
            raise ConfigError(key, f"socket path is longer than 107 bytes: {path}")


# --- `hunter config show|check` -------------------------------------------------------------------


def to_toml(config: Config) -> str:
    """The configuration as a TOML document (valid input for `--config`)."""
    data = config.to_dict()
    lines: list[str] = []
    tables: list[tuple[str, dict[str, object]]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, cast("dict[str, object]", value)))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables:
        lines.append(f"\n[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in cast("list[object]", value)) + "]"
    return repr(value)


def add_parser(subparsers: Any) -> None:
    """Register `hunter config show` and `hunter config check` on the CLI's subparsers."""
    p = subparsers.add_parser("config", help="show or check the daemon configuration")
    sp = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("show", "print the configuration `hunter serve` would use (TOML, or --json)"),
        ("check", "validate the configuration; exit 2 naming the first bad key"),
    ):
        c = sp.add_parser(name, help=help_text)
        c.add_argument("--config", metavar="FILE", help="TOML config file (default $HUNTER_CONFIG)")
        c.add_argument("--root", metavar="DIR", help="the root directory (default ./.hunter)")
        if name == "show":
            c.add_argument("--json", action="store_true", help="print JSON instead of TOML")
        c.set_defaults(handler=_config_command)


def _config_command(args: argparse.Namespace) -> int:
    overrides = {"root": args.root} if args.root else None
    try:
        config = load_config(
            Path(args.config) if args.config else None, env=os.environ, overrides=overrides
        )
    except ConfigError as exc:
        sys.stderr.write(f"hunter config: {exc}\n")
        return 2
    if args.config_command == "check":
        sys.stdout.write("configuration OK\n")
    elif getattr(args, "json", False):
        sys.stdout.write(json.dumps(config.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(to_toml(config))
    return 0
