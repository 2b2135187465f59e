"""Fixtures of the store tests: the private PostgreSQL cluster (`pg_cluster`).

The conformance suite tests what every engine guarantees of `TurnStore.recover` (a daemon
takes back what it held, and turns nobody holds); what only one engine does is tested with that
engine (the embedded one takes every unfinished turn, whoever held it, in
``test_sqlite_engine.py``; the shared one leaves another daemon's live claims alone, in
``test_postgres_engine.py``).

The cluster starts on first use (`pg_cluster.shared_cluster`), so a run that touches only the
SQLite engine never starts it; this session fixture stops it, and removes its files, at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.store.pg_cluster import (
    PgCluster,
    database_for,
    shared_cluster,
    stop_shared_cluster,
)


@pytest.fixture(scope="session", autouse=True)
def _stop_pg_cluster() -> Iterator[None]:
    """Stops the session's PostgreSQL cluster (if a test started it) when the session ends."""
    yield
    stop_shared_cluster()


@pytest.fixture(scope="session")
def pg_cluster() -> PgCluster:
    """The session's private PostgreSQL cluster (started now if no test started it yet)."""
    return shared_cluster()


@pytest.fixture
def pg_dsn(pg_cluster: PgCluster, tmp_path: Path) -> str:
    """A DSN of a fresh database of this test's own on the session's cluster."""
    return database_for(tmp_path)
