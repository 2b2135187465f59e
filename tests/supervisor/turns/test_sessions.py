"""The daemon's sessions (`supervisor.turns.sessions.DaemonSessions`) with a real sandbox
session's ledger files: committed lines reach the files once per event-loop pass, before the
tasks woken after the commit, and never before the commit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from ledger import SealedLine, verify_session_dir
from ledger.chain import content_hash
from sandbox.runtime import Runtime, Session
from supervisor.store.protocol import SessionRecord, SessionState
from supervisor.turns.sessions import DaemonSessions, verify_ledgers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox session needs root")


def _turns_in(path: Path) -> list[int]:
    return [
        entry["turn_number"]
        for entry in map(json.loads, path.read_bytes().splitlines())
        if entry.get("kind") == "turn"
    ]


def _seal(session: Session, turn: int) -> tuple[SealedLine, SealedLine]:
    return session.ledgers.seal_turn(
        turn_number=turn,
        query_hash=content_hash({"n": turn}),
        result_hash=content_hash({}),
        status="succeeded",
    )


async def test_committed_lines_leave_once_per_pass_before_the_woken_tasks(
    sandbox_runtime: Runtime,
) -> None:
    """With the flusher running, the lines of several turns committed together are written in
    the flusher's pass, which runs before a task woken after them; uncommitted lines never."""
    sessions = DaemonSessions(sandbox_runtime)
    with sandbox_runtime.open_session("pkg") as session:
        sessions.add(session)
        seen: list[list[int]] = []
        answered = anyio.Event()

        async def client() -> None:  # stands for a client's answer, woken after the commit
            await answered.wait()
            seen.append(_turns_in(session.exec_ledger_path))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sessions.run_flusher)
            tg.start_soon(client)
            await anyio.lowlevel.checkpoint()  # both wait now
            sealed = [_seal(session, n) for n in (1, 2, 3)]
            sessions.flush(session.session_id, sealed[0])
            sessions.flush(session.session_id, sealed[1])
            assert _turns_in(session.exec_ledger_path) == []  # not yet: the flusher's pass
            answered.set()
            with anyio.fail_after(5):
                while not seen:
                    await anyio.lowlevel.checkpoint()
            assert seen == [[1, 2]]  # turn 3 was never committed: held
            assert _turns_in(session.ledgers.evidence_path) == [1, 2]
            sessions.flush(session.session_id, sealed[2])
            sessions.write_pending()  # a reader that cannot wait for the pass
            assert _turns_in(session.exec_ledger_path) == [1, 2, 3]
            tg.cancel_scope.cancel()
        session.sync_ledgers()
        assert [r.entries for r in verify_session_dir(session.exec_ledger_path.parent)] == [4, 4]


async def test_without_the_flusher_a_flush_writes_at_once(sandbox_runtime: Runtime) -> None:
    """Outside a running turn core (recovery at start, tools), `flush` writes immediately."""
    sessions = DaemonSessions(sandbox_runtime)
    with sandbox_runtime.open_session("pkg") as session:
        sessions.add(session)
        sessions.flush(session.session_id, _seal(session, 1))
        assert _turns_in(session.exec_ledger_path) == [1]


def _items(report: dict[str, object], key: str) -> list[dict[str, Any]]:
    items = report[key]
    assert isinstance(items, list)
    return items


def _record(session_id: str, state: SessionState = SessionState.OPEN) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        package_id="pkg",
        tier="default",
        work_order_id=None,
        workspace=None,
        state=state,
        opened_us=1,
        closed_us=None,
        turns=0,
    )


async def test_a_fleet_daemon_checks_the_ledgers_it_homes_and_names_the_home_of_the_others(
    sandbox_runtime: Runtime,
) -> None:
    """`hunter check-ledgers` on a daemon of a fleet: its sessions' ledgers are verified; a
    session another daemon homes is "homed by <daemon>, checked there", not `ledger missing`;
    a session no daemon homes is verified where its files are and noted where they are not."""
    with (
        sandbox_runtime.open_session("pkg") as mine,
        sandbox_runtime.open_session("pkg") as closed_here,
    ):
        records = [
            _record(mine.session_id),
            _record("SES-homed-by-b"),
            _record("SES-closed-elsewhere", SessionState.CLOSED),
            _record(closed_here.session_id, SessionState.CLOSED),
        ]
        homes = {mine.session_id: "daemon-a", "SES-homed-by-b": "daemon-b"}
        report = await verify_ledgers(sandbox_runtime.root, records, homes=homes, owner="daemon-a")
    assert report["ok"] is True
    assert report["failures"] == []
    verified = {r["session_id"] for r in _items(report, "ledgers")}
    assert verified == {mine.session_id, closed_here.session_id}
    elsewhere = {e["session_id"]: e for e in _items(report, "elsewhere")}
    assert set(elsewhere) == {"SES-homed-by-b", "SES-closed-elsewhere"}
    assert elsewhere["SES-homed-by-b"]["detail"] == "homed by daemon-b, checked there"
    assert elsewhere["SES-closed-elsewhere"]["home"] is None
    assert "no daemon homes it now (closed)" in elsewhere["SES-closed-elsewhere"]["detail"]
    alone = await verify_ledgers(sandbox_runtime.root, records[1:2])  # no fleet: missing is bad
    assert alone["ok"] is False
