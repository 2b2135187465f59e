"""Three daemons on one PostgreSQL (three roots standing for three hosts), real executors on
each, turns submitted through all three; one daemon SIGKILLed under load, another SIGSTOPped
past its lease and resumed.

What a user would notice is checked: every acknowledged turn ends exactly once and succeeds,
the sessions of the lost daemons are taken over and their turns finished elsewhere, the paused
daemon finds its claims gone when it wakes and records nothing (a late write would be refused by
the fencing token: `tests/supervisor/store/test_postgres_fleet.py`), `hunter status` lists the
daemons with their heartbeats, and the ledgers exported from the store verify, against the store
too. The takeover time is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.confine.mounts import mounts_under
from supervisor.control.client import call_once
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from tests.supervisor.store.pg_cluster import (
    PgCluster,
    database_for,
)

pytestmark = pytest.mark.slow

LEASE_MS = 1500


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-fleet-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _hunter(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
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


def _config(dsn: str) -> str:
    return DEMO_CONFIG + (
        f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\npool_size = 2\n'
        f"lease_ms = {LEASE_MS}\npoll_ms = 100\n"
    )


async def _daemon(base: Path, name: str, dsn: str, behaviour: list[str]) -> DemoStack:
    root = base / name
    config = prepare_root(root, fresh=True, config_text=_config(dsn))
    migrated = _hunter("store", "migrate", "--root", str(root), "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    stack = DemoStack(root=root, config_path=config)
    await stack.start_daemon()
    argv = ["supervisor.examples.chaos_executor", "--commands", "READ,CLICK", "--no-reconnect"]
    for spec in behaviour:
        argv += ["--behaviour", spec]
    await stack.start_executor(f"ex-{name}", [*argv, "--delay-ms", "1200"])
    return stack


def _events(stack: DemoStack, event: str) -> list[dict[str, Any]]:
    found = []
    for line in stack.daemon_log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


async def _logged(stack: DemoStack, event: str, timeout_s: float = 20) -> None:
    """Wait until the daemon's log has *event* (the log is a file: polled)."""
    deadline = time.monotonic() + timeout_s
    while not _events(stack, event):
        if time.monotonic() > deadline:
            tail = stack.daemon_log.read_text(encoding="utf-8", errors="replace")[-6000:]
            raise AssertionError(f"no {event} in the daemon's log; its end:\n{tail}")
        await anyio.sleep(0.2)


async def _submit(stack: DemoStack, sid: str, key: str, command: str = "READ") -> int:
    answer = await call_once(
        stack.control_socket,
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type=command,
        target_selector="h1",
        idempotency_key=key,
        declared_outputs=[],
    )
    return int(answer["turn"]["turn_id"])


async def _final(stack: DemoStack, turn_id: int) -> dict[str, Any]:
    answer = await call_once(stack.control_socket, "turn.wait", turn_id=turn_id, timeout_s=60)
    return dict(answer["turn"])


async def test_three_daemons_survive_a_kill_and_a_pause(pg_cluster: PgCluster, base: Path) -> None:
    dsn = database_for(base)
    stacks: dict[str, DemoStack] = {}
    try:
        stacks["a"] = await _daemon(base, "a", dsn, ["ok"])
        stacks["b"] = await _daemon(base, "b", dsn, ["CLICK=slow", "READ=ok"])
        stacks["c"] = await _daemon(base, "c", dsn, ["ok"])
        clients = dict(stacks)
        sessions = {
            n: str(
                (await call_once(clients[n].control_socket, "session.open", package_id="demo"))[
                    "session_id"
                ]
            )
            for n in ("a", "b", "c")
        }

        # 1. turns of every session submitted through every daemon
        submitted: list[tuple[str, int]] = []
        for i in range(30):
            owner, via = "abc"[i % 3], "abc"[(i // 3) % 3]
            turn_id = await _submit(clients[via], sessions[owner], f"p1-{i}")
            submitted.append((via, turn_id))
        firsts = [await _final(clients[via], t) for via, t in submitted]
        assert [t["state"] for t in firsts] == ["succeeded"] * 30
        status = await call_once(clients["c"].control_socket, "status")
        assert len(status["daemons"]) == 3
        shown = _hunter("status", "--root", str(base / "c"))
        assert shown.returncode == 0, shown.stderr
        assert "HEARTBEAT" in shown.stdout

        # 2. SIGKILL daemon a under load: its acknowledged turns finish elsewhere
        loaded = [await _submit(clients["a"], sessions["a"], f"p2-a{i}") for i in range(10)]
        loaded += [await _submit(clients["b"], sessions["a"], f"p2-b{i}") for i in range(10)]
        killed_at = time.monotonic()
        await stacks["a"].stop_daemon(signal.SIGKILL)
        del clients["a"]
        after_kill = [await _final(clients["b"], t) for t in loaded]
        takeover_s = time.monotonic() - killed_at
        assert [t["state"] for t in after_kill] == ["succeeded"] * 20
        adopted = _events(stacks["b"], "session_adopted") + _events(stacks["c"], "session_adopted")
        assert sessions["a"] in {e["session_id"] for e in adopted}
        # another daemon's session, its files written here from the store: a takeover
        assert {e["adopted_as"] for e in adopted if e["session_id"] == sessions["a"]} == {
            "takeover"
        }

        # 3. SIGSTOP daemon b past its lease with attempts running (its executor is slow)
        paused = [
            await _submit(clients["b"], sessions["b"], f"p3-{i}", command="CLICK") for i in range(4)
        ]
        await anyio.sleep(0.4)  # dispatched to b's slow executor
        assert stacks["b"].daemon is not None
        os.kill(stacks["b"].daemon.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            after_pause = [await _final(clients["c"], t) for t in paused]
            pause_takeover_s = time.monotonic() - stopped_at
        finally:
            os.kill(stacks["b"].daemon.pid, signal.SIGCONT)
        assert [t["state"] for t in after_pause] == ["succeeded"] * 4
        # each was interrupted on b (a CRASH) and finished by c
        assert all(t["attempts"][-1]["executor_id"] == "ex-c" for t in after_pause)
        # the attempts b was running are recorded as cut short by c's takeover, not a restart
        owner_c = (await call_once(clients["c"].control_socket, "status"))["turn_core"]["owner"]
        crashed = [a for t in after_pause for a in t["attempts"] if a["fault_type"] == "CRASH"]
        assert crashed
        assert {a["detail"] for a in crashed} == {
            "interrupted by a takeover: the daemon running it stopped renewing its claim (lease"
            f" {LEASE_MS} ms), and daemon {owner_c} took the turn over"
        }
        # b wakes: whichever comes first, its lease renewal (the claims are gone: the turns
        # stop) or the write of a late result (refused by the fencing token), no second
        # result is recorded
        await _logged(stacks["b"], "session_home_lost")
        stopped_turns = {
            int(e["turn_id"])
            for name in ("claim_lost", "stale_result_refused")
            for e in _events(stacks["b"], name)
            if "turn_id" in e
        }
        assert set(paused) & stopped_turns
        again = [await _final(clients["c"], t) for t in paused]
        assert [t["attempts"] for t in again] == [t["attempts"] for t in after_pause]

        # 4. exactly once: one final turn entry per turn in the store's ledgers, which export
        #    and verify (also against the store's lines and anchored heads)
        out = base / "export"
        exported = _hunter("ledger", "export", "--root", str(out), "--dsn", dsn)
        assert exported.returncode == 0, exported.stderr
        verified = _hunter("ledger", "verify", "--root", str(out), "--store", "--dsn", dsn)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        finals: dict[int, int] = {}
        for sid in sessions.values():
            path = next(out.glob(f"planes/*/sessions/{sid}/ledger/exec.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                if entry.get("kind") == "turn" and "turn_id" in entry:
                    finals[entry["turn_id"]] = finals.get(entry["turn_id"], 0) + 1
        every = {t for _, t in submitted} | set(loaded) | set(paused)
        assert set(finals) == every
        assert set(finals.values()) == {1}
        # an entry altered in the store, or dropped from a file, is found
        database = dsn.partition("?")[0].rpartition("/")[2]
        victim = f"{sessions['c']}/evidence"
        pg_cluster.psql(
            "UPDATE ledger_lines SET line = convert_to("
            "replace(convert_from(line, 'UTF8'), '\"kind\"', '\"kind\" '), 'UTF8')"
            f" WHERE ledger_id = '{victim}' AND seq = 2",
            database=database,
        )
        altered = _hunter("ledger", "verify", "--root", str(out), "--store", "--dsn", dsn)
        assert altered.returncode == 1
        assert f"MISMATCH {victim} seq 2: the file and the store differ" in altered.stdout
        exec_file = next(out.glob(f"planes/*/sessions/{sessions['b']}/ledger/exec.jsonl"))
        kept = exec_file.read_text(encoding="utf-8").splitlines(keepends=True)
        exec_file.write_text("".join(kept[:-1]), encoding="utf-8")
        dropped = _hunter(
            "ledger",
            "verify",
            "--root",
            str(out),
            "--store",
            "--session",
            sessions["b"],
            "--dsn",
            dsn,
        )
        assert dropped.returncode == 1
        assert "in the store, missing from the file" in dropped.stdout
        # 5. the killed host comes back: daemon a starts on its root again and reclaims what
        #    the SIGKILLed run left there (the session disk of the session it no longer homes:
        #    its tmpfs and the two mounts on tmp/<sid> and output/<sid>)
        assert mounts_under(base / "a"), "the SIGKILLed daemon left no session disk"
        await stacks["a"].start_daemon()
        assert mounts_under(base / "a") == []
        [reclaimed] = _events(stacks["a"], "sandbox_leftovers_reclaimed")
        assert reclaimed["sessions"] >= 1
        sys.stderr.write(
            f"takeover after SIGKILL: {takeover_s:.2f} s; after SIGSTOP: {pause_takeover_s:.2f} s"
            f" (lease {LEASE_MS} ms)\n"
        )
    finally:
        for stack in stacks.values():
            with anyio.CancelScope(shield=True):
                await stack.aclose()


async def test_process_turns_and_escalations_across_daemons(
    pg_cluster: PgCluster, base: Path
) -> None:
    """A process turn submitted to a daemon that is not its session's home runs at the home (in
    its sandbox) and escalates; a person resolves it from the other daemon; the home carries
    the decision out, with the ending's ledger entries (the evidence entry names who decided,
    as the other daemon saw the caller), and the chain exports and verifies."""
    dsn = database_for(base)
    stacks: dict[str, DemoStack] = {}
    try:
        stacks["a"] = await _daemon(base, "a", dsn, ["ok"])
        stacks["b"] = await _daemon(base, "b", dsn, ["ok"])
        sock_a, sock_b = stacks["a"].control_socket, stacks["b"].control_socket
        sid = str((await call_once(sock_a, "session.open", package_id="demo"))["session_id"])
        submitted = await call_once(
            sock_b,
            "turn.submit",
            session_id=sid,
            kind="process",
            argv=["python3", "-c", "b = bytearray(512 << 20)"],
            declared_outputs=[],
        )
        turn_id = int(submitted["turn"]["turn_id"])
        parked = await _final(stacks["b"], turn_id)
        assert parked["state"] == "escalated", parked
        listed = await call_once(sock_b, "escalations.list")
        assert turn_id in [t["turn_id"] for t in listed["escalations"]]
        resolved = await call_once(
            sock_b,
            "escalations.resolve",
            turn_id=turn_id,
            action="terminate",
            reason="over its memory limit",
            operator="ops on-call",
        )
        assert resolved["turn"]["state"] == "terminated"
        assert resolved["turn"]["reason_code"] == "OPERATOR_TERMINATED"
        decided = resolved["turn"]["result"]["decided_by"]
        assert (decided["uid"], decided["operator"]) == (os.getuid(), "ops on-call")
        assert (decided["action"], decided["reason"]) == ("terminate", "over its memory limit")
        out = base / "export"
        assert _hunter("ledger", "export", "--root", str(out), "--dsn", dsn).returncode == 0
        verified = _hunter("ledger", "verify", "--root", str(out), "--store", "--dsn", dsn)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        exec_file = next(out.glob(f"planes/*/sessions/{sid}/ledger/exec.jsonl"))
        statuses = [
            json.loads(line).get("status")
            for line in exec_file.read_text(encoding="utf-8").splitlines()
            if json.loads(line).get("kind") == "turn"
        ]
        assert statuses[-1] == "terminated"
        assert "escalated" in statuses  # the escalation's entry, then the ending's
        evidence_file = exec_file.with_name("evidence.jsonl")
        last = json.loads(evidence_file.read_text(encoding="utf-8").splitlines()[-1])
        assert last["decided_by"] == decided  # written by the home, a, as b was asked
    finally:
        for stack in stacks.values():
            with anyio.CancelScope(shield=True):
                await stack.aclose()


async def test_a_daemon_restarted_on_its_root_records_a_restart_not_a_takeover(
    pg_cluster: PgCluster, base: Path
) -> None:
    """In a fleet, a daemon SIGKILLed with an attempt running starts again on the same root:
    its session comes back with the files this root kept, and the attempt it was running is
    recorded as interrupted by its restart (the log, the attempt's detail), as a daemon alone
    on its store records it: no other daemon took anything over."""
    dsn = database_for(base)
    stack = await _daemon(base, "a", dsn, ["CLICK=slow", "READ=ok"])
    try:
        opened = await call_once(stack.control_socket, "session.open", package_id="demo")
        sid = str(opened["session_id"])
        turn_id = await _submit(stack, sid, "restart-1", command="CLICK")
        await anyio.sleep(0.4)  # dispatched to the slow executor: its attempt runs
        await stack.stop_daemon(signal.SIGKILL)
        await stack.stop_executor("ex-a", signal.SIGKILL)
        await stack.start_daemon()
        await stack.start_executor(
            "ex-a2",
            ["supervisor.examples.chaos_executor", "--commands", "READ,CLICK", "--no-reconnect"],
        )
        turn = await _final(stack, turn_id)
        assert turn["state"] == "succeeded"
        [crashed] = [a for a in turn["attempts"] if a["fault_type"] == "CRASH"]
        assert crashed["detail"] == (
            "interrupted by a restart of this daemon: it stopped while the attempt ran"
        )
        [adopted] = [e for e in _events(stack, "session_adopted") if e["session_id"] == sid]
        assert adopted["adopted_as"] == "restart"
        causes = {e["cause"] for e in _events(stack, "attempt_interrupted")}
        assert causes == {"restart"}
    finally:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
