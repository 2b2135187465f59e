"""`hunter store migrate`: bring the configured turn store's schema to this hunter's version.

With ``store.engine = "postgres"`` the migrations run against the database of ``store.dsn`` (one
transaction under an advisory lock, so a daemon starting at the same time cannot apply a step
twice); `hunter serve` never migrates PostgreSQL itself. With the embedded SQLite engine the
store file is opened, which migrates it (as `hunter serve` does). It prints what it did (from
version X to Y, or already current) and exits 0; a configuration problem, a server that cannot
be reached or refuses us, or a schema newer than this hunter's exits 2 with the message.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio

from supervisor.cli.exit_codes import EXIT_OK, EXIT_USAGE
from supervisor.config import Config, ConfigError, load_config

__all__ = ["add_store_parser"]

#: how long `hunter store migrate` waits for the server to answer
CONNECT_TIMEOUT_S = 10.0


def add_store_parser(subparsers: Any) -> None:
    """Register `hunter store migrate`."""
    p = subparsers.add_parser("store", help="manage the turn store (schema migrations)")
    sp = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    m = sp.add_parser(
        "migrate",
        help="apply the schema migrations to the configured turn store (run before "
        "`hunter serve` with store.engine = postgres)",
    )
    m.add_argument("--config", metavar="FILE", help="TOML config file (default $HUNTER_CONFIG)")
    m.add_argument("--root", metavar="DIR", help="the root directory (default ./.hunter)")
    m.set_defaults(handler=_cmd_migrate)


def _cmd_migrate(args: argparse.Namespace) -> int:
    overrides = {"root": args.root} if args.root else None
    try:
        config = load_config(
            Path(args.config) if args.config else None, env=os.environ, overrides=overrides
        )
    except ConfigError as exc:
        sys.stderr.write(f"hunter store migrate: {exc}\n")
        return EXIT_USAGE
    from supervisor.server import StoreStartError

    try:
        if config.store.engine == "postgres":
            where, found, now = anyio.run(_migrate_postgres, config)
        else:
            where, found, now = anyio.run(_migrate_sqlite, config)
    except StoreStartError as exc:
        sys.stderr.write(f"hunter store migrate: {exc}\n")
        return EXIT_USAGE
    if found == now:
        sys.stdout.write(f"{where}: schema version {now}, already current\n")
    else:
        before = "no schema" if found is None else f"version {found}"
        sys.stdout.write(f"{where}: migrated from {before} to version {now}\n")
    return EXIT_OK


async def _migrate_postgres(config: Config) -> tuple[str, int | None, int]:
    from supervisor.server import connect_failure, postgres_target, store_start_errors
    from supervisor.store.postgres import migrate_database

    dsn, where = postgres_target(config)
    try:
        found, now = await migrate_database(dsn, timeout_s=CONNECT_TIMEOUT_S)
    except store_start_errors() as exc:
        raise connect_failure(where, exc) from None
    return where, found, now


async def _migrate_sqlite(config: Config) -> tuple[str, int | None, int]:
    from supervisor.errors import SchemaVersionError
    from supervisor.server import StoreStartError
    from supervisor.store.sqlite import SCHEMA_VERSION, open_sqlite_store

    path = config.intake_path
    where = f"sqlite turn store {path}"
    found = _sqlite_version(path)
    try:
        async with open_sqlite_store(path):
            pass
    except (SchemaVersionError, OSError, sqlite3.Error) as exc:
        raise StoreStartError(f"{where}: {exc}") from None
    return where, found, SCHEMA_VERSION


def _sqlite_version(path: Path) -> int | None:
    """The schema version recorded in the SQLite store at *path* (None: no file, or none)."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'turn_store_schema'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return int(row[0]) if row else None
