"""Fixtures shared by the daemon's tests: the private PostgreSQL clusters.

`pg_cluster` is one cluster for the whole session, started on first use
(`tests/supervisor/store/pg_cluster.shared_cluster`), so a run that never touches PostgreSQL never
starts it; it is stopped, and its files removed, when the session ends. `pg_dsn` is a fresh
database of the test's own on it. `own_pg_cluster` is a cluster of one test's own, for tests
that crash or restart the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.store.pg_cluster import (
    PgCluster,
    database_for,
    shared_cluster,
    start_cluster,
    stop_cluster,
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


@pytest.fixture
def own_pg_cluster() -> Iterator[PgCluster]:
    """A cluster of this test's own (it may crash and restart it), removed afterwards."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
