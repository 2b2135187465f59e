"""`hunter config show|check`: the configuration rendered as TOML (or JSON), and its check.

The rendering is `Config.to_dict()`, which is every key and nothing else; the configuration
holds no secrets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from supervisor.config.loader import config_file_for, load_config
from supervisor.config.schema import Config
from supervisor.errors import ConfigError

__all__ = ["add_parser", "to_toml"]


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
        c.add_argument(
            "--config",
            metavar="FILE",
            help="TOML config file (default $HUNTER_CONFIG, else ROOT/hunter.toml if it exists)",
        )
        c.add_argument("--root", metavar="DIR", help="the root directory (default ./.hunter)")
        if name == "show":
            c.add_argument("--json", action="store_true", help="print JSON instead of TOML")
        c.set_defaults(handler=_config_command)


def _config_command(args: argparse.Namespace) -> int:
    overrides = {"root": args.root} if args.root else None
    # the file `hunter serve` would read: --config, $HUNTER_CONFIG, else ROOT/hunter.toml
    path = config_file_for(
        config=Path(args.config) if args.config else None,
        root=Path(args.root) if args.root else None,
        env=os.environ,
    )
    try:
        config = load_config(path, env=os.environ, overrides=overrides)
    except ConfigError as exc:
        sys.stderr.write(f"hunter config: {exc}\n")
        return 2
    read = "no configuration file (defaults and HUNTER_* variables)" if path is None else path
    if args.config_command == "check":
        sys.stdout.write("configuration OK\n" if path is None else f"configuration OK: {path}\n")
    elif getattr(args, "json", False):
        sys.stderr.write(f"hunter config: read {read}\n")
        sys.stdout.write(json.dumps(config.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(f"# read {read}\n" + to_toml(config))
    return 0
