"""Loading the configuration: defaults, systemd's directories, the TOML file, `HUNTER_*`
variables and explicit overrides, parsed and validated into one `Config`.

Any problem (unknown key, wrong type, out of range, unreadable or invalid TOML) raises
`ConfigError` naming the dotted key and the problem. Relative paths are taken relative to the
current directory and made absolute. The only file I/O is in `load_config` (reading the one TOML
file).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, cast

from supervisor.config.dsn import dsn_problem
from supervisor.config.schema import ENV_PREFIX, FIELDS, SECTIONS, Config, env_var_name
from supervisor.errors import ConfigError

__all__ = ["RESERVED_ENV", "load_config"]

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
        parsed[key] = _parse(key, FIELDS[key], raw, source)

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
        if name in SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(name, "must be a table (section)", source=source)
            for sub, subvalue in cast("Mapping[str, object]", value).items():
                key = f"{name}.{sub}"
                if key not in FIELDS:
                    raise ConfigError(key, "unknown key", source=source)
                out[key] = subvalue
        elif name in FIELDS:
            out[name] = value
        else:
            raise ConfigError(name, "unknown key", source=source)
    return out


def _env_key(name: str) -> str:
    rest = name[len(ENV_PREFIX) :].lower()
    section, sep, sub = rest.partition("__")
    key = f"{section}.{sub}" if sep else rest
    if key in FIELDS and (sep or key not in SECTIONS):
        return key
    hint = ""
    for candidate in FIELDS:
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


def _parse_dsn(key: str, raw: object, source: str, from_env: bool) -> object:
    if not isinstance(raw, str):
        raise _wrong(key, "a connection string", raw, source)
    text = raw.strip()
    if not text:
        return ""
    problem = dsn_problem(text)
    if problem is not None:  # the value is not repeated: it may hold a password
        raise ConfigError(key, problem, source=source)
    return text


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


def _parse_listen(key: str, raw: object, source: str, from_env: bool) -> object:
    if not isinstance(raw, str):
        raise _wrong(key, "'HOST:PORT' or a Unix socket path", raw, source)
    text = raw.strip()
    if not text or "/" in text:
        if "\0" in text:
            raise ConfigError(key, "path contains a NUL byte", source=source)
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise _wrong(key, "'HOST:PORT' (port 1-65535) or a Unix socket path", raw, source)
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


_PARSERS: Final[dict[str, Callable[[str, object, str, bool], object]]] = {
    "path": _parse_path,
    "int": _parse_int,
    "float": _parse_float,
    "str": _parse_str,
    "mode": _parse_mode,
    "uids": _parse_uids,
    "dsn": _parse_dsn,
    "listen": _parse_listen,
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
    for section, cls in SECTIONS.items():
        kwargs = {k.partition(".")[2]: v for k, v in parsed.items() if k.startswith(f"{section}.")}
        if section == "store" and kwargs.get("password_file") is not None:
            kwargs["password_file"] = absolute(kwargs["password_file"])
        if section == "metrics":
            if kwargs.get("textfile") is not None:
                kwargs["textfile"] = absolute(kwargs["textfile"])
            listen = kwargs.get("listen")
            if isinstance(listen, str) and "/" in listen:  # a Unix socket path
                kwargs["listen"] = str(absolute(Path(listen)))
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
