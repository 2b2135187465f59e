"""The PostgreSQL engine of the turn store: several daemons (hosts) share one database.

Imports asyncpg and the protocol's records; nothing from the daemon above the store seam.
"""

from supervisor.store.postgres.engine import (
    PostgresTurnStore,
    describe_dsn,
    migrate_database,
    open_postgres_store,
)
from supervisor.store.postgres.schema import SCHEMA_VERSION, SchemaNotMigratedError

__all__ = [
    "SCHEMA_VERSION",
    "PostgresTurnStore",
    "SchemaNotMigratedError",
    "describe_dsn",
    "migrate_database",
    "open_postgres_store",
]
