"""The `TurnStore` conformance suite, run against every engine.

Adding an engine is one more entry in `ENGINES`: a name and a function that, given the test's
temporary directory, returns a `StoreFactory` (each call opens the same storage again).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.store.postgres import open_postgres_store
from supervisor.store.sqlite import open_sqlite_store
from tests.supervisor.store.conformance import StoreFactory, TurnStoreConformance
from tests.supervisor.store.pg_cluster import database_for


def _sqlite(tmp_path: Path) -> StoreFactory:
    return lambda: open_sqlite_store(tmp_path / "state" / "turns.sqlite3")


def _sqlite_threaded(tmp_path: Path) -> StoreFactory:
    """SQLite with every batch on the worker thread (what a slow disk switches to)."""
    return lambda: open_sqlite_store(tmp_path / "state" / "turns.sqlite3", inline_limit_s=0)


def _postgres(tmp_path: Path) -> StoreFactory:
    """PostgreSQL: a database of the test's own on the session's private cluster."""
    dsn = database_for(tmp_path)
    return lambda: open_postgres_store(dsn)


ENGINES: dict[str, Callable[[Path], StoreFactory]] = {
    "sqlite": _sqlite,
    "sqlite-threaded": _sqlite_threaded,
    "postgres": _postgres,
}


@pytest.fixture(params=sorted(ENGINES))
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens a store of the engine under test over this test's storage."""
    engine: str = request.param
    return ENGINES[engine](tmp_path)


class TestTurnStoreConformance(TurnStoreConformance):
    """Every protocol rule, per engine."""
