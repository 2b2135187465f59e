"""Daemon configuration: one frozen `Config`, loaded from TOML and `HUNTER_*` variables.

Precedence, lowest first:

1. built-in defaults (the embedded root `./.hunter`);
2. systemd's `$STATE_DIRECTORY` / `$RUNTIME_DIRECTORY` (defaults for `root` / `runtime_dir`);
3. the TOML file (`--config FILE`, else `$HUNTER_CONFIG`, else none);
4. `HUNTER_*` environment variables: `HUNTER_<KEY>` for a top-level key and
   `HUNTER_<SECTION>__<KEY>` (two underscores) for a key in a section, e.g. `HUNTER_ROOT`,
   `HUNTER_LOG__FORMAT`, `HUNTER_EXECUTORS__HEARTBEAT_INTERVAL_S`;
5. explicit overrides (command-line flags such as `--root` and `--log-format`).

Every key is declared once, in `supervisor.config.schema`, as an annotated field of a frozen
msgspec Struct with its type, default, bounds, meaning and whether a SIGHUP reload applies it;
msgspec checks the merged sources against it, and the same table drives the messages,
`Config.to_dict()` and `diff_reloadable()`; docs/configuration.md has one row per key (checked
by the tests).
`add_parser()` registers `hunter config show|check`.
Any problem (unknown key, wrong type, out of range, unreadable or invalid TOML) raises
`ConfigError` naming the dotted key and the problem (an unknown key with a "did you mean"
hint); the CLI turns it into exit code 2 before
anything starts. Relative paths are taken relative to the current directory and made absolute
when loaded. The package does file I/O only in `load_config` (reading the one TOML file) and
`config_file_for` (which file that is: ``--config``, ``$HUNTER_CONFIG``, else the root's
``hunter.toml`` when it exists).

The package's modules: `schema` (the settings Structs and the key table), `loader` (sources,
parsing, validation), `diff` (what a SIGHUP reload can apply), `show` (`hunter config
show|check`), `dsn` (PostgreSQL connection strings: refused with a password, described for
messages). Import from `supervisor.config`: `__all__` below is the package's interface.
"""

from __future__ import annotations

from supervisor.config.diff import ConfigDiff, changed_keys, diff_reloadable
from supervisor.config.loader import RESERVED_ENV, ROOT_CONFIG_NAME, config_file_for, load_config
from supervisor.config.schema import (
    ENV_PREFIX,
    RELOADABLE_KEYS,
    Config,
    ExecutorSettings,
    LogSettings,
    RetrySettings,
    SandboxSettings,
    StoreSettings,
    env_var_name,
    iter_keys,
)
from supervisor.config.schema import Enforcement as Enforcement
from supervisor.config.schema import LogFormat as LogFormat
from supervisor.config.schema import LogLevel as LogLevel
from supervisor.config.schema import StoreEngine as StoreEngine
from supervisor.config.show import add_parser, to_toml
from supervisor.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "RELOADABLE_KEYS",
    "RESERVED_ENV",
    "ROOT_CONFIG_NAME",
    "Config",
    "ConfigDiff",
    "ConfigError",
    "ExecutorSettings",
    "LogSettings",
    "RetrySettings",
    "SandboxSettings",
    "StoreSettings",
    "add_parser",
    "changed_keys",
    "config_file_for",
    "diff_reloadable",
    "env_var_name",
    "iter_keys",
    "load_config",
    "to_toml",
]
