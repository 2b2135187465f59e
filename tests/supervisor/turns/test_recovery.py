"""A turn's one durable step, and putting files and store back in step after a crash.

The turn core runs over a real SQLite store, real session ledgers and a scripted hub (the rig of
`test_core.py`); "crash" means the daemon's task group is cancelled mid-turn, or files are put
back to an older copy, as a power loss would leave them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import orjson
import pytest

from sandbox.policy.lifecycle import TurnState
from supervisor.turns.recovery import ROLLED_FORWARD, endings_in_ledger
from supervisor.turns.requests import parse_turn_request
from tests.supervisor.turns.test_core import FakeHub, _instruction, _open, _run, _verify, rig


def _ledger_dir(root: Path, sid: str) -> Path:
    return root / "planes" / "default" / "sessions" / sid / "ledger"


def _turn_entries(root: Path, sid: str, which: str) -> list[dict[str, object]]:
    path = _ledger_dir(root, sid) / f"{which}.jsonl"
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [e for e in entries if e["kind"] == "turn"]


async def test_ending_and_lines_commit_together_then_files_catch_up(tmp_path: Path) -> None:
    """The ending's commit keeps both lines in the store; a sync round makes the files durable
    and trims them; readers of the files see the entries at once."""
    async with rig(tmp_path, ledger_sync_interval_s=0.05) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        # in the files at once (written, perhaps not yet synced)
        (entry,) = _turn_entries(tmp_path, sid, "exec")
        assert (entry["status"], entry["turn_id"], entry["verdict"]) == (
            "succeeded",
            turn.turn_id,
            "SUCCEED",
        )
        assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
        ids = [f"{sid}/exec", f"{sid}/evidence"]
        for _ in range(500):  # a sync round every 50 ms; give it up to 10 s
            if not await r.store.ledger_lines(ids):
                break
            await anyio.sleep(0.02)
        assert await r.store.ledger_lines(ids) == []
        session = r.runtime.sessions[sid]
        assert session.ledgers.exec.durable_seq == session.ledgers.exec.head[0] == 2
        assert session.ledgers.evidence.durable_seq == 2
        # idle rounds write nothing to the store (only ledgers that moved are trimmed)
        writes = r.store.statistics().operations
        await anyio.sleep(0.3)
        assert r.store.statistics().operations == writes


async def test_restart_writes_back_lines_the_files_lost(tmp_path: Path) -> None:
    """Files put back to before the turn (a power loss before their sync): the restart writes
    the turn's two lines back from the store, the chain verifies, nothing runs twice."""
    async with rig(tmp_path, ledger_sync_interval_s=3600) as r:
        sid = await _open(r)
        ledger_dir = _ledger_dir(tmp_path, sid)
        heads_dir = tmp_path / "state" / "ledger-heads"
        shutil.copytree(ledger_dir, tmp_path / "before-ledger")
        shutil.copytree(heads_dir, tmp_path / "before-heads")
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        expected = (ledger_dir / "exec.jsonl").read_bytes()
    for name in ("exec.jsonl", "evidence.jsonl"):
        shutil.copy(tmp_path / "before-ledger" / name, ledger_dir / name)
    shutil.rmtree(heads_dir)
    shutil.copytree(tmp_path / "before-heads", heads_dir)
    assert _turn_entries(tmp_path, sid, "exec") == []
    hub = FakeHub()
    async with rig(tmp_path, hub) as r2:
        assert (ledger_dir / "exec.jsonl").read_bytes() == expected
        assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]
        assert await r2.store.ledger_lines([f"{sid}/exec", f"{sid}/evidence"]) == []
        assert (await r2.store.get_turn(turn.turn_id)).state is TurnState.SUCCEEDED
    assert hub.envelopes == []


@pytest.mark.parametrize("start_written", [True, False])
async def test_restart_ends_a_turn_from_its_ledger_entry(
    tmp_path: Path, start_written: bool
) -> None:
    """The turn's final entry reached the file but the daemon died before the store's commit:
    the restart ends the turn from the entry; it is not run again and has one final pair.
    Whether the attempt's start was written (`running`) or still rode with the outcome
    (`accepted`), the ending records the attempt."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        r.scheduler._deps.starts.delay_s = 0.0 if start_written else 60.0
        sid = await _open(r)
        turn, _ = await r.scheduler.submit(parse_turn_request(_instruction(sid)))
        await hub.started.wait()
        if start_written:
            await r.scheduler.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
        stored = await r.store.get_turn(turn.turn_id)
        expected = TurnState.RUNNING if start_written else TurnState.ACCEPTED
        assert stored.state is expected
        # What a crash between the file write and the commit leaves: the entries in the files.
        session = r.runtime.sessions[sid]
        session.ledgers.record_turn(
            turn_number=turn.turn_number,
            query_hash="0" * 64,
            result_hash="1" * 64,
            status="failed",
            exec_extra={"verdict": "TERMINATE", "reason_code": "EXECUTOR_FAILURE"},
        )
    rerun = FakeHub()
    async with rig(tmp_path, rerun) as r2:
        done = await r2.scheduler.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.FAILED
        assert (done.verdict, done.reason_code, done.reason) == (
            "TERMINATE",
            "EXECUTOR_FAILURE",
            ROLLED_FORWARD,
        )
        assert [a.attempt for a in done.attempts] == [1]
    assert rerun.envelopes == []
    assert len(_turn_entries(tmp_path, sid, "exec")) == 1
    assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
    assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]


def test_endings_in_ledger_reads_final_entries_only(tmp_path: Path) -> None:
    """Only final statuses count, the last one wins, other turns and junk lines are ignored."""
    path = tmp_path / "exec.jsonl"
    lines = [
        {"kind": "session_opened", "session_id": "S"},
        {"kind": "turn", "turn_number": 1, "status": "escalated"},
        {"kind": "turn", "turn_number": 2, "status": "succeeded", "verdict": "SUCCEED"},
        {"kind": "turn", "turn_number": 1, "status": "terminated", "reason_code": "OPERATOR"},
        {"kind": "turn", "turn_number": 3, "status": "escalated"},
        {"kind": "turn", "turn_number": 4, "status": "no-such-state"},
    ]
    path.write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in lines) + b'{"turn_number": 5, junk\n'
    )
    found = endings_in_ledger(path, [1, 2, 3, 4, 5, 6])
    assert sorted(found) == [1, 2]
    assert (found[1].state, found[1].reason_code) == (TurnState.TERMINATED, "OPERATOR")
    assert found[2].to_ending().verdict == "SUCCEED"
    assert endings_in_ledger(tmp_path / "missing.jsonl", [1]) == {}
    assert endings_in_ledger(path, []) == {}
