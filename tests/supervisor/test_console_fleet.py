"""The console against a fleet: two daemons on one PostgreSQL, the console on one daemon's
socket; the overview lists both, and marks the one that was SIGKILLed as gone, without a
reload of anything but the page (docs/console.md)."""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from supervisor.console.operators import hash_password, load_operators
from supervisor.console.server import parse_listen, run_console
from supervisor.console.state import ConsoleSettings
from tests.supervisor.store.pg_cluster import PgCluster, database_for
from tests.supervisor.test_fleet import LEASE_MS, _daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-console-fleet-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _overview(http: httpx.AsyncClient) -> str:
    page = await http.get("/")
    assert page.status_code == 200, page.text[:300]
    return page.text


async def test_every_daemon_of_the_fleet_appears_and_a_dead_one_is_marked(
    pg_cluster: PgCluster, base: Path
) -> None:
    dsn = database_for(base)
    a = await _daemon(base, "a", dsn, [])
    b = await _daemon(base, "b", dsn, [])
    ops = base / "ops.toml"
    ops.write_text(f'[operators.ops]\nrole = "reader"\npassword = "{hash_password("pw")}"\n')
    settings = ConsoleSettings(socket=a.control_socket, operators=load_operators(ops))
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            url = await tg.start(
                lambda task_status: run_console(
                    settings,
                    parse_listen("127.0.0.1:0"),
                    handle_signals=False,
                    stop=stop,
                    task_status=task_status,
                )
            )
            try:
                async with httpx.AsyncClient(base_url=url, timeout=20) as http:
                    with anyio.fail_after(20):
                        while (await http.get("/healthz")).status_code != 200:  # noqa: ASYNC110
                            await anyio.sleep(0.05)
                    form = await http.get("/login")
                    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
                    assert token
                    await http.post(
                        "/login",
                        data={"form_token": token.group(1), "name": "ops", "password": "pw"},
                    )
                    assert a.daemon is not None
                    assert b.daemon is not None
                    page = await _overview(http)
                    assert f"<td>{a.daemon.pid}</td>" in page
                    assert f"<td>{b.daemon.pid}</td>" in page
                    assert page.count("<td>alive</td>") == 2
                    await b.stop_daemon(signal.SIGKILL)
                    with anyio.fail_after(20 + 3 * LEASE_MS / 1000):
                        while "GONE (past its lease)" not in await _overview(http):  # noqa: ASYNC110
                            await anyio.sleep(0.2)
                    page = await _overview(http)
                    assert page.count("<td>alive</td>") == 1
            finally:
                stop.set()
    finally:
        await b.aclose()
        await a.aclose()
