"""The embedded SQLite engine of the turn store."""

from supervisor.store.sqlite.engine import SqliteTurnStore, open_sqlite_store
from supervisor.store.sqlite.schema import SCHEMA_VERSION, SchemaVersionError

__all__ = ["SCHEMA_VERSION", "SchemaVersionError", "SqliteTurnStore", "open_sqlite_store"]
