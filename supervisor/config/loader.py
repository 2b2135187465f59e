"""Loading the configuration: defaults, systemd's directories, the TOML file, `HUNTER_*`
variables and explicit overrides, merged and converted by msgspec into one `Config`.

The sources are merged key by key (a later one wins); a value whose key parses more than msgspec
does (an environment string, an octal mode, a uid list, a DSN, a listen address) is prepared by
its kind first. `msgspec.convert` then checks types, bounds, choices and unknown keys against
`supervisor.config.schema`, and its error (`... - at `$.executors.heartbeat_s``) becomes a
`ConfigError` naming the dotted key, the problem and the source; an unknown key gets a "did you
mean" hint. Relative paths are taken relative to the current directory and made absolute. The
only file I/O is in `load_config` (reading the one TOML file) and `config_file_for` (whether the
root's ``hunter.toml`` is there).
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import math
import os
import re
from collections.abc import Container, Mapping
from pathlib import Path, PurePath
from typing import Any, Final, cast

import msgspec

from supervisor.config.dsn import dsn_problem
from supervisor.config.schema import ENV_PREFIX, KEYS, SECTIONS, Config, env_var_name, value_of
from supervisor.errors import ConfigError

__all__ = ["RESERVED_ENV", "ROOT_CONFIG_NAME", "config_file_for", "load_config"]

# `HUNTER_*` names the product uses for other things (so they are not rejected as unknown):
# the config file, the chaos executor's behaviour, what the sandbox sets for a turn, and the
# switch of the per-stage costs (`supervisor.stages`, a diagnostic).
RESERVED_ENV: Final = frozenset(
    {
        "HUNTER_CONFIG",
        "HUNTER_STAGE_COSTS",
        "HUNTER_CHAOS",
        "HUNTER_SESSION_ID",
        "HUNTER_TURN_NUMBER",
        "HUNTER_OUTPUT_DIR",
    }
)

_TOML_LINE: Final = re.compile(r"at line (\d+)")
#: msgspec's error: the message, then the path (`$.retry.max_attempts`, `$.allowed_uids[1]`).
_ERROR: Final = re.compile(r"(.*?)(?: - at `\$\.?([^`\[]*)(?:\[(\d+)\])?`)?", re.S)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(.*)`", re.S)
_BOUND: Final = re.compile(r"` (>=|>|<=) (\S+)$")
#: What a key of each kind takes, for "expected ..., got ..." messages.
_EXPECTED: Final = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "path": "a non-empty path string",
    "mode": "an octal mode such as '0660' or 0o660",
    "uids": "a list of uids",
    "dsn": "a connection string",
    "listen": "'HOST:PORT' or a Unix socket path",
}


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
    values: dict[str, tuple[object, str]] = {}  # dotted key -> (prepared value, source)

    def add(data: Mapping[str, object], source: str, *, from_env: bool = False) -> None:
        for key, raw in _flatten(data, source).items():
            if raw is not None:
                spec = KEYS.get(key)
                value = _prepare(key, spec.kind, raw, source, from_env) if spec else raw
                values[key] = (value, source)

    if path is None and env.get("HUNTER_CONFIG"):
        path = Path(env["HUNTER_CONFIG"])
    if path is not None:
        add(_read_toml(path), str(path))
    for name, text in env.items():
        if name.startswith(ENV_PREFIX) and name not in RESERVED_ENV:
            add({_env_key(name): text}, name, from_env=True)
    if overrides:
        add(overrides, "override")

    merged: dict[str, Any] = {}
    for key, (value, _) in values.items():
        section, dot, name = key.partition(".")
        if dot and section in SECTIONS:
            merged.setdefault(section, {})[name] = value
        else:
            merged[key] = value
    try:
        config = msgspec.convert(merged, Config, dec_hook=_to_path)
    except msgspec.ValidationError as exc:
        raise _explain(str(exc), values) from None
    config = _derive(config, values, env)
    _check_consistency(config)
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            "(file)", f"cannot read {path}: {exc.strerror}", source=str(path)
        ) from exc
    try:
        # Decoded here, not by msgspec: its versions word a non-UTF-8 file differently (0.22
        # raises UnicodeDecodeError, 0.23 a DecodeError about the TOML).
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("(file)", f"{path} is not UTF-8 text", source=str(path)) from exc
    try:
        return msgspec.toml.decode(text, type=dict[str, Any])
    except msgspec.DecodeError as exc:
        match = _TOML_LINE.search(str(exc))
        line = int(match.group(1)) if match else None
        raise ConfigError(
            "(file)", f"invalid TOML in {path}: {exc}", source=str(path), line=line
        ) from exc


def _flatten(data: Mapping[str, object], source: str) -> dict[str, object]:
    """`{"log": {"level": x}}` and `{"log.level": x}` alike as `{"log.level": x}`."""
    out: dict[str, object] = {}
    for name, value in data.items():
        if name not in SECTIONS:
            out[name] = value
        elif isinstance(value, Mapping):
            out.update(
                (f"{name}.{sub}", v) for sub, v in cast("Mapping[str, object]", value).items()
            )
        else:
            raise ConfigError(name, "must be a table (section)", source=source)
    return out


def _env_key(name: str) -> str:
    rest = name[len(ENV_PREFIX) :].lower()
    section, sep, sub = rest.partition("__")
    key = f"{section}.{sub}" if sep else rest
    if key in KEYS:
        return key
    raise ConfigError(
        key,
        f"unknown environment variable {name} (HUNTER_<KEY> or HUNTER_<SECTION>__<KEY>)"
        + _hint(key, env=True),
        source=name,
    )


def _hint(key: str, *, env: bool = False) -> str:
    """The hint for an unknown key: "; did you mean 'executors.queue_wait_s'?" naming the known
    key closest to `key` (within its section when that is known), or "" when none is close."""
    section, dot, name = key.partition(".")
    if dot and section in SECTIONS:
        names = [k.partition(".")[2] for k in KEYS if k.startswith(f"{section}.")]
        close = [f"{section}.{n}" for n in difflib.get_close_matches(name, names, n=1)]
    else:  # a top-level key, or a misspelt section (a file's may be a whole table)
        close = difflib.get_close_matches(key, [*KEYS, *([] if env else SECTIONS)], n=1)
    if not close:
        return ""
    return f"; did you mean {env_var_name(close[0]) if env else repr(close[0])}?"


def _prepare(key: str, kind: str, raw: object, source: str, from_env: bool) -> object:
    """`raw` as the schema's type takes it, for the kinds that parse more than msgspec does; a
    value that makes no sense here is left as it is, for msgspec to refuse."""
    if isinstance(raw, PurePath) and kind == "path":
        raw = str(raw)
    if not isinstance(raw, str):
        if kind == "float" and type(raw) is int and abs(raw) <= 2**53:  # exactly a float
            return float(raw)  # so that a message shows the value the key would hold (0.0)
        return list(raw) if kind == "uids" and isinstance(raw, tuple | set | frozenset) else raw
    text = raw.strip()
    if kind == "path" and "\0" in raw:
        raise ConfigError(key, "path contains a NUL byte", source=source)
    if kind == "mode":
        digits = text.lower().removeprefix("0o")
        if not digits or digits.strip("01234567"):
            raise ConfigError(
                key, f"expected an octal mode such as '0660', got {raw!r}", source=source
            )
        return int(digits, 8)
    if kind == "uids":
        try:
            return [int(part, 10) for part in raw.replace(" ", "").split(",") if part]
        except ValueError:
            problem = f"expected a comma-separated list of uids, got {raw!r}"
            raise ConfigError(key, problem, source=source) from None
    if kind == "dsn":
        refused = dsn_problem(text) if text else None
        if refused is not None:  # the value is not repeated: it may hold a password
            raise ConfigError(key, refused, source=source)
        return text
    if kind == "listen":
        return _listen(key, raw, source)
    if from_env:
        with contextlib.suppress(ValueError):
            if kind == "int":
                return int(text.replace("_", ""), 10)
            if kind == "float":
                return float(text)
        if kind == "str" and KEYS[key].choices:  # a choice is case-insensitive; a name is not
            return text.lower()
        if kind == "str":
            return text
    return raw


def _listen(key: str, raw: str, source: str) -> str:
    text = raw.strip()
    if not text or "/" in text:  # off, or a Unix socket path
        if "\0" in text:
            raise ConfigError(key, "path contains a NUL byte", source=source)
        return os.path.abspath(text) if text else ""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        problem = f"expected 'HOST:PORT' (port 1-65535) or a Unix socket path, got {raw!r}"
        raise ConfigError(key, problem, source=source)
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        loopback = bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            key,
            f"{host!r} is not a loopback address: metrics are served without authentication, "
            "so listen on 127.0.0.1, [::1] or a Unix socket (or use metrics.textfile)",
            source=source,
        )
    return text


def _to_path(kind: type, value: object) -> Path:
    """msgspec's hook for `Path` keys: a non-empty string, made absolute."""
    if kind is Path and isinstance(value, str) and value:
        return Path(os.path.abspath(value))
    raise ValueError  # explained as "expected a non-empty path string"


def _explain(error: str, values: Mapping[str, tuple[object, str]]) -> ConfigError:
    """msgspec's error (`Expected `int` >= 1 - at `$.retry.max_attempts``) as a `ConfigError`
    naming the dotted key, the value and the source."""
    match = _ERROR.fullmatch(error)
    assert match is not None  # the pattern's every part is optional
    message, key, index = match.group(1), match.group(2) or "", match.group(3)
    unknown = _UNKNOWN.fullmatch(message)
    if unknown:
        key = f"{key}.{unknown.group(1)}" if key else unknown.group(1)
        return ConfigError(key, "unknown key" + _hint(key), source=values[key][1])
    value, source = values[key]
    spec = KEYS[key]
    bound = _BOUND.search(message)
    if index is not None:  # an item of `allowed_uids`
        value = cast("list[object]", value)[int(index)]
        problem = f"expected uids between 0 and 4294967294, got {value!r}"
    elif isinstance(value, float) and not math.isfinite(value):
        problem = f"expected a finite number, got {value!r}"
    elif bound and spec.kind == "mode":
        problem = f"must be {bound.group(1)} {int(bound.group(2)):04o}, got {value:04o}"
    elif bound:
        limit = float(bound.group(2))
        shown = int(limit) if limit.is_integer() else limit
        problem = f"must be {bound.group(1)} {shown}, got {value!r}"
    elif message.startswith("Invalid enum value"):
        problem = f"must be one of {', '.join(map(repr, spec.choices))}, got {value!r}"
    else:
        problem = f"expected {_EXPECTED[spec.kind]}, got {value!r}"
    return ConfigError(key, problem, source=source)


def _derive(config: Config, given: Container[str], env: Mapping[str, str]) -> Config:
    """The computed defaults of the paths no source set (see docs/configuration.md)."""

    def pick(key: str, default: Path) -> Path:
        return (
            cast("Path", value_of(config, key)) if key in given else Path(os.path.abspath(default))
        )

    root = pick("root", _first_dir(env.get("STATE_DIRECTORY")) or Path(".hunter"))
    runtime = pick("runtime_dir", _first_dir(env.get("RUNTIME_DIRECTORY")) or root / "run")
    return msgspec.structs.replace(
        config,
        root=root,
        runtime_dir=runtime,
        control_socket=pick("control_socket", runtime / "control.sock"),
        executor_socket=pick("executor_socket", runtime / "executors.sock"),
        intake_path=pick("intake_path", root / "state" / "turns.sqlite3"),
    )


#: The file in the root that `hunter serve --root DIR` reads when no other file is named
#: (`./scripts/demo --root DIR` writes it).
ROOT_CONFIG_NAME: Final = "hunter.toml"


def config_file_for(
    *, config: Path | None, root: Path | None, env: Mapping[str, str]
) -> Path | None:
    """The configuration file `hunter serve` (and `hunter config show|check`) reads: *config*
    (``--config FILE``), else ``$HUNTER_CONFIG``, else ``ROOT/hunter.toml`` when it is a file,
    ROOT being the root served without a file: *root* (``--root``), else ``$HUNTER_ROOT``,
    else systemd's ``$STATE_DIRECTORY``, else ``./.hunter``. None: no file (the defaults and
    the ``HUNTER_*`` variables)."""
    if config is not None:
        return config
    if env.get("HUNTER_CONFIG"):
        return Path(env["HUNTER_CONFIG"])
    served = (
        root
        or (Path(env["HUNTER_ROOT"]) if env.get("HUNTER_ROOT") else None)
        or _first_dir(env.get("STATE_DIRECTORY"))
        or Path(".hunter")
    )
    candidate = Path(os.path.abspath(served / ROOT_CONFIG_NAME))
    return candidate if candidate.is_file() else None


def _first_dir(value: str | None) -> Path | None:
    # systemd joins several directories (StateDirectory=a b) with ':'; the first is ours.
    if not value:
        return None
    first = value.split(":", 1)[0]
    return Path(first) if first else None


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
    if config.store.engine == "postgres" and not config.store.dsn:
        raise ConfigError("store.dsn", "must be set when store.engine is 'postgres'")
    s = config.sandbox
    if s.uid_range_start + s.uid_range_size - 1 > 4_294_967_294:
        raise ConfigError(
            "sandbox.uid_range_size",
            f"range starting at {s.uid_range_start} must end at or below uid 4294967294",
        )
    sockets = [
        ("control_socket", config.control_socket),
        ("executor_socket", config.executor_socket),
    ]
    if "/" in config.metrics.listen:
        sockets.append(("metrics.listen", Path(config.metrics.listen)))
    for key, path in sockets:
        # sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
        if len(os.fsencode(path)) > 107:
            raise ConfigError(key, f"socket path is longer than 107 bytes: {path}")
