"""End to end on PostgreSQL: a real `hunter store migrate`, a real `hunter serve` process with
``[store] engine = "postgres"`` on the private test cluster, real executor processes.

Also the start-up refusals: a database not yet migrated, and a server that is not there, end
`hunter serve` with exit 2 and a message naming the server and what to do, without a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import verify_root
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from supervisor.errors import ControlClientError
from supervisor.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA
from tests.supervisor.store.pg_cluster import (
    PgCluster,
    database_for,
)

pytestmark = pytest.mark.slow

_CONFIG = DEMO_CONFIG.replace("queue_wait_s = 3.0", "queue_wait_s = 5.0")


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root other users can traverse, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hh-pg-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _store_config(dsn: str) -> str:
    return _CONFIG + f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\npool_size = 2\n'


def _hunter(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


async def _run(client: ControlClient, sid: str, **params: Any) -> dict[str, Any]:
    params.setdefault("declared_outputs", [])
    submitted = await client.call("turn.submit", session_id=sid, **params)
    result = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(result["turn"])


async def test_migrate_then_serve_instruction_turns(pg_cluster: PgCluster, root: Path) -> None:
    """`hunter store migrate` on a fresh database, then `hunter serve` on it: instruction turns
    on a real executor succeed, they are rows in PostgreSQL (no SQLite file is made), and every
    session ledger verifies."""
    dsn = database_for(root)
    config = prepare_root(root, fresh=True, config_text=_store_config(dsn))

    first = _hunter("store", "migrate", "--root", str(root), "--config", str(config))
    assert first.returncode == 0, first.stderr
    assert f"migrated from no schema to version {PG_SCHEMA}" in first.stdout
    again = _hunter("store", "migrate", "--root", str(root), "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert "already current" in again.stdout

    stack = DemoStack(root=root, config_path=config)
    try:
        await stack.start_daemon()
        await stack.start_executor(
            "ok-1",
            [
                "supervisor.examples.chaos_executor",
                "--commands",
                "READ,CLICK",
                "--behaviour",
                "ok",
                "--no-reconnect",
            ],
        )
        async with ControlClient(stack.control_socket) as client:
            sid = str((await client.call("session.open", package_id="demo"))["session_id"])
            turns = [
                await _run(
                    client, sid, kind="instruction", command_type=command, target_selector="h1"
                )
                for command in ("READ", "CLICK", "READ")
            ]
        assert [t["state"] for t in turns] == ["succeeded"] * 3
        assert all(t["attempts"][0]["executor_id"] == "ok-1" for t in turns)
        # a row no hunter wrote: a clear error naming it, and the daemon goes on
        database = dsn.partition("?")[0].rpartition("/")[2]
        hostile = turns[0]["turn_id"]
        pg_cluster.psql(
            f"UPDATE turns SET state = 'bogus' WHERE turn_id = {hostile}", database=database
        )
        async with ControlClient(stack.control_socket) as client:
            with pytest.raises(ControlClientError) as refused:  # a listing reads the store
                await client.call("turns.list", session_id=sid)
            assert refused.value.code == "store_integrity"
            assert f"turns[{hostile}]" in str(refused.value)
            assert (await client.call("turn.get", turn_id=turns[1]["turn_id"]))["turn"][
                "state"
            ] == ("succeeded")
        pg_cluster.psql(
            f"UPDATE turns SET state = 'succeeded' WHERE turn_id = {hostile}", database=database
        )
        assert await stack.stop_daemon() == 0
    finally:
        await stack.aclose()

    database = dsn.partition("?")[0].rpartition("/")[2]
    rows = pg_cluster.psql("SELECT state, count(*) FROM turns GROUP BY state", database=database)
    assert rows.split() == ["succeeded|3"]
    assert not (root / "state" / "turns.sqlite3").exists()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


def test_serve_refuses_an_unmigrated_database(pg_cluster: PgCluster, root: Path) -> None:
    """`hunter serve` against a database never migrated exits 2 naming the server and
    `hunter store migrate`, without a traceback, and creates no schema."""
    dsn = database_for(root)
    config = prepare_root(root, fresh=True, config_text=_store_config(dsn))
    done = _hunter("serve", "--root", str(root), "--config", str(config), "--log-format", "json")
    assert done.returncode == 2, done.stderr
    assert "hunter store migrate" in done.stderr
    assert str(pg_cluster.socket_dir) in done.stderr
    assert "no turn store schema yet" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    database = dsn.partition("?")[0].rpartition("/")[2]
    tables = pg_cluster.psql(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", database=database
    )
    assert tables.strip() == "0"


def test_serve_refuses_a_newer_schema(pg_cluster: PgCluster, root: Path) -> None:
    """A database migrated by a newer hunter: `hunter serve` exits 2 saying so; `hunter store
    migrate` refuses to touch it too."""
    dsn = database_for(root)
    config = prepare_root(root, fresh=True, config_text=_store_config(dsn))
    assert _hunter("store", "migrate", "--root", str(root), "--config", str(config)).returncode == 0
    database = dsn.partition("?")[0].rpartition("/")[2]
    pg_cluster.psql(
        "UPDATE hunter_meta SET value = '99' WHERE key = 'turn_store_schema'", database=database
    )
    done = _hunter("serve", "--root", str(root), "--config", str(config), "--log-format", "json")
    assert done.returncode == 2, done.stderr
    assert f"schema version 99, newer than the {PG_SCHEMA} this hunter supports" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    migrate = _hunter("store", "migrate", "--root", str(root), "--config", str(config))
    assert migrate.returncode == 2
    assert f"newer than the {PG_SCHEMA}" in migrate.stderr


def test_serve_exits_2_when_the_server_is_not_there(root: Path, tmp_path: Path) -> None:
    """A DSN pointing at a socket directory with no server: exit 2 within seconds, naming the
    socket directory, port, user and what failed; no traceback, no READY."""
    empty = tmp_path / "no-server"
    empty.mkdir()
    dsn = f"postgresql://hunter_app@/turns?host={empty}&port=5499"
    config = prepare_root(root, fresh=True, config_text=_store_config(dsn))
    started = time.monotonic()
    done = _hunter("serve", "--root", str(root), "--config", str(config), "--log-format", "json")
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert elapsed < 15
    assert f"cannot connect to postgresql server {empty} port 5499" in done.stderr
    assert "user hunter_app" in done.stderr
    assert "No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
