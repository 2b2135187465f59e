"""The PostgreSQL engine beyond the conformance suite: the private cluster, several daemons."""

from __future__ import annotations

import os

import asyncpg

from tests.supervisor.store.pg_cluster import PgCluster


async def test_private_cluster_is_durable_and_unprivileged(
    pg_cluster: PgCluster, pg_dsn: str
) -> None:
    """The tests' cluster keeps the durability settings on and never runs as root."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("fsync", "synchronous_commit", "full_page_writes", "listen_addresses")
        }
    finally:
        await conn.close()
    assert settings == {
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "listen_addresses": "",
    }
    pid = int((pg_cluster.data / "postmaster.pid").read_text().split()[0])
    assert os.stat(f"/proc/{pid}").st_uid != 0
