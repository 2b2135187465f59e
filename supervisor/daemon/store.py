"""Opening the configured turn store at start: embedded SQLite by default, or PostgreSQL opened
without migrating, whose failures (unreachable, refused, not migrated, an unreadable password
file) become one `StoreStartError` naming the server and what to do. Apart from the daemon
because `hunter store` and `hunter ledger` use the same pieces without one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from supervisor.config import Config
from supervisor.config.dsn import describe, to_uri, with_password
from supervisor.errors import SchemaVersionError
from supervisor.store.fleet import FleetStore
from supervisor.store.protocol import TurnStore
from supervisor.store.sqlite import open_sqlite_store

__all__ = [
    "StoreStartError",
    "connect_failure",
    "fleet_of",
    "open_store",
    "postgres_target",
    "store_start_errors",
]


class StoreStartError(RuntimeError):
    """The configured PostgreSQL turn store cannot be used at start: the server cannot be
    reached or refuses us, the password file cannot be read, or the schema is not the one this
    hunter needs. The message names the server, port, database and user and says what failed;
    `hunter serve` and `hunter store migrate` print it and exit 2."""


def postgres_target(config: Config) -> tuple[str, str]:
    """``(dsn for the driver, description for messages)`` of the configured PostgreSQL store;
    the password, when `store.password_file` is set, is read from it now."""
    where = describe(config.store.dsn)
    uri = to_uri(config.store.dsn)
    path = config.store.password_file
    if path is None:
        return uri, where
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise StoreStartError(
            f"{where}: cannot read store.password_file {path}: {reason}"
        ) from None
    if not lines or not lines[0]:
        raise StoreStartError(f"{where}: store.password_file {path} is empty")
    return with_password(uri, lines[0]), where


def connect_failure(where: str, exc: BaseException) -> StoreStartError:
    """A `StoreStartError` saying what failed when connecting to *where*."""
    if isinstance(exc, SchemaVersionError):
        return StoreStartError(str(exc))
    if isinstance(exc, TimeoutError):
        what = "no answer within the connect timeout"
    elif isinstance(exc, OSError):
        what = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            what += " (is the server running, and are host/port right?)"
    else:
        what = str(exc).strip() or type(exc).__name__
    return StoreStartError(f"cannot connect to {where}: {what}")


def store_start_errors() -> tuple[type[BaseException], ...]:
    """What connecting to PostgreSQL and checking its schema can raise (`connect_failure`
    turns each into a message)."""
    import asyncpg

    return (
        OSError,
        TimeoutError,
        SchemaVersionError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
    )


@contextlib.asynccontextmanager
async def open_store(config: Config) -> AsyncIterator[TurnStore]:
    """The configured turn store, open until the block ends. SQLite (`intake_path`) by default,
    exactly as before; PostgreSQL opened with ``migrate=False`` and `store.pool_size` read
    connections. A PostgreSQL store that cannot be opened raises `StoreStartError`."""
    if config.store.engine != "postgres":
        async with open_sqlite_store(config.intake_path) as store:
            yield store
        return
    from supervisor.store.postgres import open_postgres_store

    dsn, where = postgres_target(config)
    errors = store_start_errors()
    async with contextlib.AsyncExitStack() as stack:
        try:
            pg = await stack.enter_async_context(
                open_postgres_store(
                    dsn,
                    migrate=False,
                    read_connections=config.store.pool_size,
                    lease_ms=config.store.lease_ms,
                )
            )
        except errors as exc:
            raise connect_failure(where, exc) from None
        except BaseExceptionGroup as group:
            first = _first_leaf(group)
            if isinstance(first, errors):
                raise connect_failure(where, first) from None
            raise
        yield pg


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def fleet_of(store: TurnStore) -> FleetStore | None:
    """The store's fleet side when it is shared by several daemons (PostgreSQL)."""
    from supervisor.store.postgres import PostgresTurnStore

    return store if isinstance(store, PostgresTurnStore) else None
