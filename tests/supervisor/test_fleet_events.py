"""Daemons of a fleet joining and being lost, as a subscriber of one of them sees them
(``daemon.joined``, ``daemon.lost`` on ``events.subscribe``), and as ``status`` shows a dead
one: two daemons on one PostgreSQL, the second SIGKILLed."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor.control.client import ControlClient, call_once
from tests.supervisor.store.pg_cluster import PgCluster, database_for
from tests.supervisor.test_fleet import LEASE_MS, _daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-fleetev-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_subscriber_sees_a_daemon_join_and_be_lost_and_status_marks_it_gone(
    pg_cluster: PgCluster, base: Path
) -> None:
    dsn = database_for(base)
    a = await _daemon(base, "a", dsn, [])
    try:
        async with (
            ControlClient(a.control_socket) as client,
            client.subscribe(kinds=["daemon.joined", "daemon.lost"]) as events,
        ):
            await anyio.sleep(LEASE_MS / 1000)  # a's first look at the fleet: itself only
            b = await _daemon(base, "b", dsn, [])
            with anyio.fail_after(20):
                joined = await events.__anext__()
            assert joined["kind"] == "daemon.joined"
            owner = joined["daemon"]
            assert b.daemon is not None
            assert f"pid {b.daemon.pid}" in joined["detail"]
            await b.stop_daemon(signal.SIGKILL)
            with anyio.fail_after(20):
                lost = await events.__anext__()
            assert (lost["kind"], lost["daemon"]) == ("daemon.lost", owner)
            assert "no heartbeat for" in lost["detail"]
            assert "taken over" in lost["detail"]
            status = await call_once(a.control_socket, "status")
            gone = [d for d in status["daemons"] if d["owner"] == owner]
            assert gone
            assert gone[0]["alive"] is False
            assert all(d["alive"] for d in status["daemons"] if d["owner"] != owner)
            await b.aclose()
    finally:
        await a.aclose()
