"""A turn's sandbox dirs are empty once it has ended, and what was there is on the record."""

from __future__ import annotations

import errno
import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog

from sandbox.policy.attempts import AgentPhase, RetryOptions
from sandbox.runtime.area import SessionArea
from sandbox.runtime.session import Session

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
SCRATCH_BYTES = 48 << 20
#: scratch in tmp/<sid> must be declared (FR-RT-016, fail closed)
SCRATCH = {"path": "tmp/**", "role": "scratch"}  # below the default 64 MiB per-file limit


def turn_entry(session: Session, ledger: str, turn_number: int) -> dict[str, Any]:
    """The turn's entry in the ``exec`` or ``evidence`` ledger."""
    path = session.ledgers.session_dir / "ledger" / f"{ledger}.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line]
    (entry,) = [
        e for e in entries if e.get("kind") == "turn" and e.get("turn_number") == turn_number
    ]
    return dict(entry)


def assert_empty_sandbox(session: Session) -> None:
    """Both dirs are there (Landlock rules are bound to them), empty, the session's, 0700."""
    for area in (session.tmp_dir, session.output_dir):
        st = area.lstat()
        assert stat.S_ISDIR(st.st_mode)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (session.uid, 0o700)
        assert list(area.iterdir()) == []


async def test_scratch_is_emptied_when_the_turn_ends(session: Session) -> None:
    """A turn writes 48 MiB of scratch (and a nested dir) besides its declared output: the
    scratch is enumerated and recorded, the output promoted, then both dirs are emptied."""
    script = (
        f'head -c {SCRATCH_BYTES} /dev/zero > "$TMPDIR/big"; '
        'mkdir -p "$TMPDIR/a/b"; echo x > "$TMPDIR/a/b/c"; echo done > report.txt'
    )
    result = await session.run_process_turn(
        ["/bin/sh", "-c", script], declared_outputs=["report.txt", SCRATCH], timeout_ms=30_000
    )
    assert result.status == "succeeded", result.stderr
    sizes = {(w.area, w.path): w.size for w in result.realized_writes}
    assert sizes == {
        ("tmp", "big"): SCRATCH_BYTES,
        ("tmp", "a/b/c"): 2,
        ("output", "report.txt"): 5,
    }
    recorded = {
        (w["area"], w["path"]) for w in turn_entry(session, "evidence", 1)["realized_writes"]
    }
    assert recorded == set(sizes)
    assert (session.workspace / "report.txt").read_text() == "done\n"
    assert_empty_sandbox(session)


async def test_undeclared_writes_are_recorded_then_removed(session: Session) -> None:
    """An undeclared output is a violation found by the enumeration before the emptying; the
    file is not promoted and does not stay in ``output/<sid>`` either."""
    result = await session.run_process_turn(
        ["/bin/sh", "-c", "echo x > sneaky.txt; echo y > $TMPDIR/t"],
        declared_outputs=[],
        timeout_ms=10_000,
    )
    assert result.status == "violation"
    assert [v.target for v in result.violations] == ["sneaky.txt", "tmp/t"]
    assert {w.path for w in result.realized_writes} == {"sneaky.txt", "t"}
    assert not (session.workspace / "sneaky.txt").exists()
    assert_empty_sandbox(session)


async def test_a_cancelled_turn_leaves_an_empty_sandbox(session: Session) -> None:
    """A turn cut short from outside: its processes are killed, its files removed."""
    ready = session.output_dir / "ready"
    script = 'echo x > "$TMPDIR/scratch"; touch ready; sleep 30'
    with anyio.move_on_after(10) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: session.run_process_turn(
                    ["/bin/sh", "-c", script], declared_outputs=[], timeout_ms=60_000
                )
            )
            for _ in range(1000):
                if ready.exists():
                    break
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert turn_entry(session, "exec", 1)["status"] == "terminated"
    assert_empty_sandbox(session)


async def test_a_failure_to_empty_is_logged_and_the_result_stands(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the dirs cannot be emptied (here: an injected EBUSY), the turn still returns its
    recorded result and the failure is logged; the next attempt empties them before it runs."""

    def busy(self: SessionArea) -> int:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(SessionArea, "empty_areas", busy)
    with structlog.testing.capture_logs() as logs:
        result = await session.run_process_turn(
            ["/bin/sh", "-c", "echo x > $TMPDIR/left"],
            declared_outputs=[SCRATCH],
            timeout_ms=10_000,
        )
    assert result.status == "succeeded"
    (event,) = [e for e in logs if e["event"] == "scratch_not_emptied"]
    assert event["log_level"] == "error"
    assert (event["when"], event["turn_number"]) == ("turn_end", 1)
    assert (session.tmp_dir / "left").exists()
    monkeypatch.undo()
    again = await session.run_process_turn(
        ["/bin/sh", "-c", "ls -A $TMPDIR"], declared_outputs=[], timeout_ms=10_000
    )
    assert again.stdout == ""
    assert_empty_sandbox(session)


async def test_attempts_are_numbered_as_the_turn_numbers_them(session: Session) -> None:
    """The daemon runs a turn again after its attempt 1 was interrupted (a restart, a
    takeover) and asks for attempt 2 on: the runtime's ``attempt_finished`` and
    ``retry_scheduled`` events, its attempts and the exec entry say 2 and 3, as the turn's
    records do, and the budget is the turn's (3 attempts in all: two of them here)."""
    delays: list[float] = []

    async def no_wait(seconds: float) -> None:
        delays.append(seconds)

    with structlog.testing.capture_logs() as logs:
        result = await session.run_process_turn(
            ["/bin/sh", "-c", "exit 1"],
            declared_outputs=[],
            timeout_ms=10_000,
            phase=AgentPhase.GREEN,
            options=RetryOptions(max_attempts=3),
            delay=no_wait,
            first_attempt=2,
        )
    assert [a.attempt_number for a in result.attempts] == [2, 3]
    assert [e["attempt"] for e in logs if e["event"] == "attempt_finished"] == [2, 3]
    assert [e["attempt"] for e in logs if e["event"] == "retry_scheduled"] == [2]
    assert result.reason_code == "RETRY_BUDGET_EXHAUSTED"
    assert "last of 3 attempts" in result.reason
    recorded = turn_entry(session, "exec", 1)["attempts"]
    assert [a["attempt_number"] for a in recorded] == [2, 3]


async def test_caller_commits_the_ledger_lines(session: Session) -> None:
    """``ledger_commit="caller"``: the ending's two lines come back sealed (not yet synced) for
    the caller's store, and stay out of the files until the caller says they are committed;
    then they are the file's bytes and the chains verify. A rejection's two lines come back
    sealed the same way."""
    from ledger import verify_session_dir

    durable_before = session.ledgers.exec.durable_seq
    size_before = session.exec_ledger_path.stat().st_size
    result = await session.run_process_turn(
        ["/bin/sh", "-c", "echo done > report.txt"],
        declared_outputs=["report.txt"],
        timeout_ms=30_000,
        ledger_commit="caller",
    )
    assert result.status == "succeeded", result.stderr
    pending = result.pending_lines
    assert pending is not None
    head_before = session.ledgers.exec.head
    assert pending.lines == ()  # not sealed: the caller's store seals once its fence held
    assert session.ledgers.exec.head == head_before
    exec_line, evidence_line = pending.seal()
    assert (exec_line.ledger_id, evidence_line.ledger_id) == session.ledger_ids
    assert exec_line.seq == head_before[0] + 1
    assert exec_line.previous_hash == head_before[1]
    assert session.ledgers.exec.durable_seq == durable_before  # nothing synced for the turn
    assert json.loads(exec_line.line)["status"] == "succeeded"
    assert "pending_lines" not in result.to_dict()
    session.flush_ledgers()  # not committed yet: a flush (another turn's) leaves them out
    session.sync_ledgers()
    assert session.exec_ledger_path.stat().st_size == size_before
    session.flush_ledgers(pending.lines)  # the caller's store committed them
    assert session.exec_ledger_path.read_bytes().endswith(exec_line.line)
    session.sync_ledgers()
    assert [r.entries for r in verify_session_dir(session.exec_ledger_path.parent.parent)] == [2, 2]
    durable_before = session.ledgers.exec.durable_seq
    rejected = await session.run_process_turn(
        ["/no/such/program"], declared_outputs=[], ledger_commit="caller"
    )
    assert rejected.status == "rejected"
    assert rejected.pending_lines is not None
    sealed = rejected.pending_lines.seal()
    assert [json.loads(x.line)["status"] for x in sealed[:1]] == ["rejected"]
    assert session.ledgers.exec.durable_seq == durable_before
    session.flush_ledgers(sealed)
    session.sync_ledgers()
    assert session.ledgers.exec.durable_seq == session.ledgers.exec.head[0]


async def test_caller_records_a_turn_cut_short(session: Session) -> None:
    """With ``ledger_commit="caller"`` a cancelled turn writes nothing here (the daemon records
    how it ended, cancelled or run again after a restart: one final pair either way); its
    process tree is still killed and its sandbox emptied."""
    heads = (session.ledgers.exec.head, session.ledgers.evidence.head)
    with anyio.move_on_after(1.0):
        await session.run_process_turn(
            ["/bin/sh", "-c", "echo x > $TMPDIR/t; sleep 30"],
            declared_outputs=[],
            timeout_ms=60_000,
            ledger_commit="caller",
        )
    assert (session.ledgers.exec.head, session.ledgers.evidence.head) == heads
    assert_empty_sandbox(session)


async def test_outputs_reach_the_workspace_only_after_the_callers_commit(
    session: Session,
) -> None:
    """With a caller that commits (the daemon), the outputs are staged, the caller records the
    turn, and only then are they placed: a commit that raises (the daemon lost its lease on the
    turn) leaves the workspace untouched and nothing staged beside it."""

    class LeaseLost(Exception):
        pass

    async def refused(result: object) -> None:
        raise LeaseLost

    argv = ["/bin/sh", "-c", "echo done > gated.txt"]
    with pytest.raises(LeaseLost):
        await session.run_process_turn(
            argv,
            declared_outputs=["gated.txt"],
            timeout_ms=30_000,
            ledger_commit="caller",
            commit=refused,
        )
    assert sorted(p.name for p in session.workspace.iterdir()) == []
    seen: list[bool] = []

    async def recorded(result: object) -> None:
        seen.append((session.workspace / "gated.txt").exists())

    done = await session.run_process_turn(
        argv,
        declared_outputs=["gated.txt"],
        timeout_ms=30_000,
        ledger_commit="caller",
        commit=recorded,
    )
    assert done.status == "succeeded", done.stderr
    assert seen == [False]  # not in place while the caller recorded the turn
    assert (session.workspace / "gated.txt").read_text() == "done\n"
    assert [p.path for p in done.promoted_outputs] == ["gated.txt"]
