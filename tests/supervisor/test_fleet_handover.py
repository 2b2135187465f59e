"""What a new user of a fleet tripped over (issue 21): daemons on one PostgreSQL where only some
have executors, each step checked the way the user met it.

* A turn submitted through a daemon with no executor is not warned of when another daemon of
  the fleet serves its command type, and it runs there: a session homed by a daemon without
  the executor is handed over to the one with it (also after a takeover, when a daemon with
  the executor joins later). A turn no live daemon serves is warned of and ends
  NO_CAPABLE_EXECUTOR once its wait runs out.
* ``hunter check-ledgers`` and ``hunter ledger verify --store`` on the root of a daemon that does
  not home a session say so and exit 0, instead of ``ledger missing`` and a ``MISMATCH``.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.control.client import call_once
from supervisor.demo.stack import DemoStack, prepare_root
from tests.supervisor.store.pg_cluster import PgCluster, database_for
from tests.supervisor.test_fleet import LEASE_MS, _config, _events, _hunter, _logged

pytestmark = pytest.mark.slow


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-handover-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _daemon(base: Path, name: str, dsn: str, commands: Sequence[str]) -> DemoStack:
    """A daemon on ``base/name`` with one executor serving *commands* (none: no executor)."""
    root = base / name
    config = prepare_root(root, fresh=True, config_text=_config(dsn))
    migrated = _hunter("store", "migrate", "--root", str(root), "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    stack = DemoStack(root=root, config_path=config)
    await stack.start_daemon()
    if commands:
        argv = ["supervisor.examples.chaos_executor", "--commands", ",".join(commands)]
        await stack.start_executor(
            f"ex-{name}", [*argv, "--no-reconnect", "--behaviour", "ok", "--delay-ms", "100"]
        )
    return stack


async def _owner(stack: DemoStack) -> str:
    status = await call_once(stack.control_socket, "status")
    return str(status["turn_core"]["owner"])


async def _sees_serving(stack: DemoStack, owner: str, command: str) -> None:
    """Wait until *owner*'s heartbeat says it serves *command* and *stack* had a look since."""
    with anyio.fail_after(20):
        while True:
            status = await call_once(stack.control_socket, "status")
            info = {d["owner"]: d["info"] for d in status["daemons"] if d["alive"]}
            if command in info.get(owner, {}).get("serves", []):
                break
            await anyio.sleep(0.1)
    await anyio.sleep(LEASE_MS / 1000)  # its next look at the fleet (every third of a lease)


async def _open(stack: DemoStack) -> str:
    answer = await call_once(stack.control_socket, "session.open", package_id="demo")
    return str(answer["session_id"])


async def _submit(
    stack: DemoStack, sid: str, command: str = "READ", **extra: object
) -> dict[str, Any]:
    return await call_once(
        stack.control_socket,
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type=command,
        target_selector="h1",
        declared_outputs=[],
        **extra,
    )


async def _final(stack: DemoStack, turn_id: int) -> dict[str, Any]:
    answer = await call_once(stack.control_socket, "turn.wait", turn_id=turn_id, timeout_s=60)
    return dict(answer["turn"])


async def test_a_turn_runs_on_the_daemon_whose_executor_serves_it(
    pg_cluster: PgCluster, base: Path
) -> None:
    dsn = database_for(base)
    stacks: list[DemoStack] = []
    try:
        a = await _daemon(base, "a", dsn, ["READ"])
        stacks.append(a)
        b = await _daemon(base, "b", dsn, [])  # no executor
        stacks.append(b)
        owner_a, owner_b = await _owner(a), await _owner(b)
        await _sees_serving(b, owner_a, "READ")

        # 1. through b, to a session homed by a: no warning, and it runs there
        sid_a = await _open(a)
        answer = await _submit(b, sid_a)
        assert "warnings" not in answer, answer["warnings"]
        done = await _final(b, int(answer["turn"]["turn_id"]))
        assert (done["state"], done["attempts"][-1]["executor_id"]) == ("succeeded", "ex-a")

        # 2. b homes no session: check-ledgers says where they are checked, exit 0; verify
        #    --store finds no files on b's root, checks the store on its own, exit 0
        checked = _hunter("check-ledgers", "--root", str(base / "b"))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"--  {sid_a}  homed by {owner_a}, checked there" in checked.stdout
        assert "ledger missing" not in checked.stdout
        on_a = _hunter("check-ledgers", "--root", str(base / "a"))
        assert on_a.returncode == 0, on_a.stdout
        assert f"ok  {sid_a}/exec" in on_a.stdout
        verified = _hunter("ledger", "verify", "--root", str(base / "b"), "--store", "--dsn", dsn)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert f"{base / 'b'} holds no session ledger files" in verified.stdout
        assert f"{sid_a}: homed by {owner_a}, checked there" in verified.stdout
        assert "form whole chains that end at their anchored heads" in verified.stdout
        assert "MISMATCH" not in verified.stdout
        assert "no sessions found" not in verified.stderr

        # 3. a session homed by b, which has no READ executor: handed over to a, run there
        sid_b = await _open(b)
        answer = await _submit(b, sid_b, wait_s=30)
        assert "warnings" not in answer, answer["warnings"]
        done = await _final(b, int(answer["turn"]["turn_id"]))
        assert (done["state"], done["attempts"][-1]["executor_id"]) == ("succeeded", "ex-a")
        [handed] = [e for e in _events(b, "session_handed_over") if e["session_id"] == sid_b]
        assert handed["takers"] == [owner_a]
        assert handed["command_types"] == ["READ"]
        assert sid_b in {e["session_id"] for e in _events(a, "session_adopted")}

        # 4. no daemon of the fleet serves CLICK: warned of, then NO_CAPABLE_EXECUTOR once the
        #    wait runs out (executors.queue_wait_s = 3 s in the demo config)
        answer = await _submit(b, sid_b, "CLICK")
        [warning] = answer["warnings"]
        assert "no executor connected to any live daemon of the fleet serves CLICK" in warning
        ended = await _final(b, int(answer["turn"]["turn_id"]))
        assert ended["reason_code"] == "NO_CAPABLE_EXECUTOR"

        # 5. the ledgers on both roots: b's copy of sid_b is a prefix (a homes it now)
        for name in ("a", "b"):
            again = _hunter("ledger", "verify", "--root", str(base / name), "--store", "--dsn", dsn)
            assert again.returncode == 0, again.stdout + again.stderr
            assert "MISMATCH" not in again.stdout
        checked = _hunter("check-ledgers", "--root", str(base / "b"))
        assert checked.returncode == 0, checked.stdout
        assert f"--  {sid_b}  homed by {owner_a}, checked there" in checked.stdout
        assert owner_b not in checked.stdout
    finally:
        for stack in stacks:
            with anyio.CancelScope(shield=True):
                await stack.aclose()


async def test_after_a_takeover_a_turn_goes_to_a_daemon_that_serves_it_again(
    pg_cluster: PgCluster, base: Path
) -> None:
    """The session's home (the only READ executor) is killed; a daemon without the executor
    takes the session over; a daemon with one joins: a READ turn of the session runs there
    instead of ending NO_CAPABLE_EXECUTOR."""
    dsn = database_for(base)
    stacks: list[DemoStack] = []
    try:
        a = await _daemon(base, "a", dsn, ["READ"])
        stacks.append(a)
        b = await _daemon(base, "b", dsn, [])
        stacks.append(b)
        sid = await _open(a)
        first = await _submit(a, sid)
        assert (await _final(a, int(first["turn"]["turn_id"])))["state"] == "succeeded"
        await a.stop_daemon(signal.SIGKILL)
        await _logged(b, "session_adopted")  # b, without a READ executor, took the session
        assert [e["session_id"] for e in _events(b, "session_adopted")] == [sid]
        c = await _daemon(base, "c", dsn, ["READ"])
        stacks.append(c)
        owner_c = await _owner(c)
        await _sees_serving(b, owner_c, "READ")
        answer = await _submit(b, sid)
        assert "warnings" not in answer, answer["warnings"]
        done = await _final(b, int(answer["turn"]["turn_id"]))
        assert (done["state"], done["attempts"][-1]["executor_id"]) == ("succeeded", "ex-c")
        [handed] = [e for e in _events(b, "session_handed_over") if e["session_id"] == sid]
        assert handed["takers"] == [owner_c]
    finally:
        for stack in stacks:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
