"""A real `hunter serve` on PostgreSQL while the server crashes and comes back under load: the
daemon stays up, `status` shows the outage while it lasts, every acknowledged turn ends once,
and the log says when the store went away and when it came back."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from supervisor.control.client import call_once
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from supervisor.store.postgres import migrate_database
from tests.supervisor.store.pg_cluster import (
    PgCluster,
    crash_and_restart,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-pgout-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_daemon_rides_out_a_postgres_crash(own_pg_cluster: PgCluster, root: Path) -> None:
    dsn = own_pg_cluster.dsn()
    config = prepare_root(
        root,
        fresh=True,
        config_text=DEMO_CONFIG + f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\n',
    )
    await migrate_database(dsn)
    stack = DemoStack(root=root, config_path=config)
    try:
        await stack.start_daemon()
        await stack.start_executor(
            "ok-1",
            ["supervisor.examples.chaos_executor", "--commands", "READ", "--no-reconnect"],
        )
        sock = stack.control_socket
        sid = str((await call_once(sock, "session.open", package_id="demo"))["session_id"])
        acknowledged: list[int] = []
        seen_down: list[dict[str, Any]] = []

        async def submit() -> None:
            for i in range(40):
                answer = await call_once(
                    sock,
                    "turn.submit",
                    session_id=sid,
                    kind="instruction",
                    command_type="READ",
                    target_selector="h1",
                    idempotency_key=f"k{i}",
                    declared_outputs=[],
                )
                acknowledged.append(int(answer["turn"]["turn_id"]))
                await anyio.sleep(0.02)

        async def watch() -> None:
            with anyio.move_on_after(6):
                while not seen_down:
                    store = (await call_once(sock, "status"))["store"]
                    if store["available"] is False:
                        seen_down.append(store)
                    await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit)
            await anyio.sleep(0.3)
            tg.start_soon(watch)
            await anyio.to_thread.run_sync(lambda: crash_and_restart(own_pg_cluster, down_s=2.0))
        assert seen_down, "status never showed the store unavailable"
        assert seen_down[0]["outages"] >= 1
        finals = [
            (await call_once(sock, "turn.wait", turn_id=t, timeout_s=60))["turn"]
            for t in acknowledged
        ]
        assert len(acknowledged) == 40
        assert [t["state"] for t in finals] == ["succeeded"] * 40, [
            (t["turn_id"], t["state"], t.get("reason_code"), t.get("reason"), t["attempts"])
            for t in finals
            if t["state"] != "succeeded"
        ]
        listed = (await call_once(sock, "turns.list", session_id=sid, limit=500))["turns"]
        assert sorted(int(t["turn_id"]) for t in listed) == sorted(acknowledged)
        assert stack.daemon is not None
        assert stack.daemon.returncode is None  # the daemon stayed up
        events = [
            json.loads(line).get("event")
            for line in stack.daemon_log.read_text(encoding="utf-8").splitlines()
            if line.startswith("{")
        ]
        assert "store_unavailable" in events
        assert "store_reconnected" in events
        assert await stack.stop_daemon() == 0
    finally:
        await stack.aclose()
