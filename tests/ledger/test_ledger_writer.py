"""Tests of ledger.writer: locking, crash recovery, durability, failure handling and held lines."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import structlog

from ledger import (
    GroupSyncer,
    InlineSyncer,
    IntegrityError,
    LedgerClosedError,
    LedgerEntry,
    LedgerLockedError,
    LedgerRecordError,
    LedgerSyncError,
    LedgerWriter,
    SealedLine,
    SessionLedgers,
    open_ledger,
    read_head,
    verify,
    verify_session_dir,
)
from ledger.chain import genesis_hash

WriteLedger = Callable[..., None]


def test_append_returns_sealed_entry(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """append assigns seq, links previous_hash, stamps ts_us and returns the entry."""
    clock = iter([100, 50, 300])
    with open_ledger(
        tmp_path / "l.jsonl", ledger_id="L", syncer=quick_syncer, clock=lambda: next(clock)
    ) as writer:
        assert writer.head == (0, genesis_hash("L"))
        first = writer.append({"kind": "a", "extra": {"nested": [1, "x"]}})
        second = writer.append({"kind": "b"})
        third = writer.append({"kind": "c"})
    assert (first.seq, second.seq, third.seq) == (1, 2, 3)
    assert first.previous_hash == genesis_hash("L")
    assert second.previous_hash == first.entry_hash
    assert [first.ts_us, second.ts_us, third.ts_us] == [100, 100, 300]  # never decreasing
    assert first.get("extra") == {"nested": [1, "x"]}
    assert first.to_dict()["ledger_id"] == "L"
    assert verify(tmp_path / "l.jsonl").head_hash == third.entry_hash


def test_reopen_continues_chain(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A reopened ledger continues at the next seq."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        assert writer.append({"kind": "b"}).seq == 2
    assert verify(path).entries == 2


def test_reopen_with_wrong_ledger_id_fails(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """The id given to open_ledger must match the file's entries."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
    with pytest.raises(IntegrityError, match=r":1: seq 1: wrong ledger id"):
        open_ledger(path, ledger_id="M", syncer=quick_syncer)


def test_record_validation_errors(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """Bad records are refused with the field named, and nothing is written."""
    with open_ledger(tmp_path / "l.jsonl", ledger_id="S/exec", syncer=quick_syncer) as writer:
        with pytest.raises(LedgerRecordError, match=r"^record\.cost: float 0\.5 is not allowed"):
            writer.append({"kind": "x", "cost": 0.5})
        with pytest.raises(LedgerRecordError, match=r"^seq: is set by the ledger writer"):
            writer.append({"kind": "x", "seq": 3})
        with pytest.raises(LedgerRecordError, match=r"^status: required for an exec turn entry$"):
            writer.append(
                {
                    "kind": "turn",
                    "session_id": "S",
                    "turn_number": 1,
                    "query_hash": "q",
                    "result_hash": "r",
                }
            )
        assert writer.head[0] == 0
    assert (tmp_path / "l.jsonl").read_bytes() == b""


def test_second_writer_in_process_refused(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A second open of the same file is refused naming this process's pid."""
    path = tmp_path / "l.jsonl"
    with (
        open_ledger(path, ledger_id="L", syncer=quick_syncer),
        pytest.raises(LedgerLockedError, match=rf"locked by another writer \(pid {os.getpid()}\)"),
    ):
        open_ledger(path, ledger_id="L", syncer=quick_syncer)
    with open_ledger(path, ledger_id="L", syncer=quick_syncer):
        pass  # released on close


def test_second_writer_process_refused(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A writer in another process is refused and learns our pid."""
    path = tmp_path / "l.jsonl"
    script = (
        "import sys\n"
        "from ledger import open_ledger, LedgerLockedError\n"
        "try:\n"
        "    open_ledger(sys.argv[1], ledger_id='L')\n"
        "except LedgerLockedError as exc:\n"
        "    print(exc.pid)\n"
    )
    with open_ledger(path, ledger_id="L", syncer=quick_syncer):
        result = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    assert result.stdout.strip() == str(os.getpid())


def test_closed_writer_refuses(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """After close, append raises LedgerClosedError (and close is idempotent)."""
    writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=quick_syncer)
    writer.close()
    writer.close()
    with pytest.raises(LedgerClosedError, match=r"ledger writer is closed$"):
        writer.append({"kind": "a"})


def test_torn_tail_moved_aside(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A last line without newline goes to .broken (appended, with offset) and is truncated."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
    intact = path.read_bytes()
    for attempt, tail in enumerate((b'{"kind":"b","se', b"\x00\x00garbage")):
        with path.open("ab") as file:
            file.write(tail)
        with structlog.testing.capture_logs() as logs:
            writer = open_ledger(path, ledger_id="L", syncer=quick_syncer)
        writer.close()
        assert path.read_bytes() == intact
        assert logs[0]["event"] == "ledger_torn_tail_moved"
        assert logs[0]["offset"] == len(intact)
        broken = (tmp_path / "l.jsonl.broken").read_bytes()
        assert broken.count(b"# torn tail of l.jsonl: offset ") == attempt + 1
        assert tail in broken
    assert verify(path).entries == 1


def test_complete_bad_line_is_not_repaired(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A complete (newline-terminated) bad last line is an IntegrityError on open."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
    data = path.read_bytes() + b'{"kind":"b"}\n'
    path.write_bytes(data)
    with pytest.raises(IntegrityError, match=r":2: seq \?: hash-less entry after a hashed one"):
        open_ledger(path, ledger_id="L", syncer=quick_syncer)
    assert path.read_bytes() == data
    assert not (tmp_path / "l.jsonl.broken").exists()


def test_torn_anchored_entry_is_refused_untouched(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """An anchored last entry that lost its newline is tampering: open refuses, changes nothing."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    data = path.read_bytes()[:-1]
    path.write_bytes(data)
    with pytest.raises(IntegrityError, match=r"truncated below anchored head"):
        open_ledger(path, ledger_id="SES-test/exec", syncer=quick_syncer)
    assert path.read_bytes() == data
    assert not (tmp_path / "l.jsonl.broken").exists()


def test_open_refuses_truncated_ledger(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Reopening a ledger truncated below its anchor fails instead of continuing."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 3)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:2]))
    with pytest.raises(IntegrityError, match=r"truncated below anchored head"):
        open_ledger(path, ledger_id="SES-test/exec", syncer=quick_syncer)


def test_head_anchored_after_each_sync(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """The head file follows the synced head."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        for expected in range(1, 4):
            entry = writer.append({"kind": "a"})
            head = read_head(tmp_path / "l.jsonl.head")
            assert head is not None
            assert (head.seq, head.entry_hash) == (expected, entry.entry_hash)


def test_injected_fsync_failure_is_fatal(tmp_path: Path) -> None:
    """A failed fdatasync fails the ledger for good: never retried, every append refused."""
    calls: list[int] = []
    fail = threading.Event()

    def sync(fd: int) -> None:
        calls.append(fd)
        if fail.is_set():
            raise OSError(5, "Input/output error")

    writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=InlineSyncer(sync=sync))
    writer.append({"kind": "a"})
    fail.set()
    with pytest.raises(LedgerSyncError, match=r"ledger failed, appends are refused: OSError"):
        writer.append({"kind": "b"})
    attempts = len(calls)
    fail.clear()
    with pytest.raises(LedgerSyncError, match=r"Input/output error"):
        writer.append({"kind": "c"})
    assert len(calls) == attempts  # not retried
    assert writer.failed
    writer.close()


def test_threads_share_syncs_inline(tmp_path: Path) -> None:
    """Concurrent appenders on one ledger are all acknowledged, seqs contiguous."""
    path = tmp_path / "l.jsonl"
    calls: list[int] = []

    def sync(fd: int) -> None:
        calls.append(fd)
        os.fdatasync(fd)

    with open_ledger(path, ledger_id="L", syncer=InlineSyncer(sync=sync)) as writer:
        seqs: list[int] = []
        lock = threading.Lock()

        def work() -> None:
            for _ in range(20):
                entry = writer.append({"kind": "a"})
                with lock:
                    seqs.append(entry.seq)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(seqs) == list(range(1, 161))
    assert verify(path).entries == 160
    assert len(calls) <= 160


_CHILD = """
import os, sys
from ledger import open_ledger
path, size = sys.argv[1], int(sys.argv[2])
out = os.fdopen(int(sys.argv[3]), "w", buffering=1)
with open_ledger(path, ledger_id="KILL/exec") as writer:
    while True:
        entry = writer.append({"kind": "blob", "data": "x" * size})
        out.write(f"{entry.seq}\\n")
"""


@pytest.mark.slow
def test_sigkill_mid_append_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    """SIGKILL at random points: reopen recovers, every acknowledged entry verifies."""
    rng = random.Random(4)
    path = tmp_path / "kill.jsonl"
    acknowledged = 0
    torn = 0
    for _round in range(30):
        size = rng.choice((10, 1000, 100_000, 400_000))
        read_fd, write_fd = os.pipe()
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(size), str(write_fd)],
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        with os.fdopen(read_fd) as acks:
            wanted = rng.randint(1, 3)
            for _ in range(wanted):
                line = acks.readline()
                assert line, "child died early"
                acknowledged = max(acknowledged, int(line))
            spin = rng.randint(0, 20_000)
            while spin:  # land the kill at a random point of the next append
                spin -= 1
            child.send_signal(signal.SIGKILL)
            child.wait()
            for line in acks:  # acknowledgements written before the kill landed
                acknowledged = max(acknowledged, int(line))
        if path.read_bytes() and not path.read_bytes().endswith(b"\n"):
            torn += 1
        with open_ledger(path, ledger_id="KILL/exec") as writer:
            assert writer.head[0] >= acknowledged
        report = verify(path)
        assert report.entries >= acknowledged
    broken = tmp_path / "kill.jsonl.broken"
    assert (torn == 0) == (not broken.exists())
    seqs = [orjson.loads(line)["seq"] for line in path.read_bytes().splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))


# -- held lines (sealed for a store's commit, kept out of the file until released) -----------


def _no_sync(fd: int) -> None:
    """Skip fdatasync (the GroupSyncer variant of the `quick_syncer` fixture)."""


def _seqs(path: Path) -> list[int]:
    return [orjson.loads(line)["seq"] for line in path.read_bytes().splitlines()]


def _turn_numbers(path: Path) -> list[int]:
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [entry["turn_number"] for entry in entries if entry["kind"] == "turn"]


def _seal_held(writer: LedgerWriter, kind: str) -> SealedLine:
    return writer.seal_prepared(writer.prepare({"kind": kind}), hold=True)[1]


def _seal_turn(ledgers: SessionLedgers, turn: int) -> tuple[SealedLine, SealedLine]:
    return ledgers.seal_turn(
        turn_number=turn,
        query_hash=f"q{turn}",
        result_hash=f"r{turn}",
        status="succeeded",
        external_calls=[{"attempt": 1, "outcome": "SUCCESS", "decision": "SUCCEED"}],
    )


def _returns_within(call: Callable[[], object], timeout_s: float) -> object:
    """Run *call* in a thread; its result, or fail if it has not returned after *timeout_s*."""
    results: list[object] = []
    done = threading.Event()

    def run() -> None:
        try:
            results.append(call())
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(timeout_s), f"did not return within {timeout_s} s"
    assert results, "raised (see the thread's exception above)"
    return results[0]


@pytest.mark.parametrize("syncer_kind", ["inline", "group"])
@pytest.mark.parametrize("push", ["flush", "wait_durable"])
def test_held_line_and_later_lines_stay_out_until_released(
    tmp_path: Path, syncer_kind: str, push: str
) -> None:
    """A held line, and a line sealed after it (another turn's, already released), stay out of
    the file through a flush or a sync of an earlier seq; once the first is released, both
    reach the file in chain order and the file verifies."""
    path = tmp_path / "l.jsonl"
    with contextlib.ExitStack() as stack:
        syncer = (
            InlineSyncer(sync=_no_sync)
            if syncer_kind == "inline"
            else stack.enter_context(GroupSyncer(sync=_no_sync))
        )
        writer = stack.enter_context(open_ledger(path, ledger_id="L", syncer=syncer))
        first = writer.append({"kind": "a"})
        held = _seal_held(writer, "b")
        later = _seal_held(writer, "c")
        writer.release([later.seq])  # committed first: still behind the held line
        assert (held.seq, later.seq, writer.head) == (2, 3, (3, later.entry_hash))
        assert writer.ready_seq == 1
        if push == "flush":
            writer.flush()
        else:
            _returns_within(lambda: writer.wait_durable(first.seq), 10)
            assert writer.durable_seq == 1
        assert _seqs(path) == [1]
        assert verify(path).head_hash == first.entry_hash
        writer.release([held.seq])
        assert writer.ready_seq == 3
        writer.flush()
        assert path.read_bytes().splitlines(keepends=True)[1:] == [held.line, later.line]
        writer.wait_durable(later.seq)
        assert writer.durable_seq == 3
    report = verify(path)
    assert (report.entries, report.head_hash, report.anchored_seq) == (3, later.entry_hash, 3)


def test_release_of_a_later_held_line_alone_writes_nothing(
    tmp_path: Path, quick_syncer: InlineSyncer
) -> None:
    """Two held lines, only the second released: nothing reaches the file; releasing the first
    then writes both, in order, and the file verifies."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
        first = _seal_held(writer, "b")
        second = _seal_held(writer, "c")
        writer.release([second.seq])
        writer.flush()
        writer.wait_durable(1)
        assert (_seqs(path), writer.ready_seq) == ([1], 1)
        writer.release([first.seq, 99])  # an unknown seq is ignored
        writer.flush()
        assert path.read_bytes().splitlines(keepends=True)[1:] == [first.line, second.line]
        writer.wait_durable(second.seq)
    assert verify(path).entries == 3


def test_an_unheld_line_lets_the_held_lines_before_it_out(
    tmp_path: Path, quick_syncer: InlineSyncer
) -> None:
    """A line sealed without *hold* (whose writer may wait for it) releases every held line
    before it: waiting for it returns, and the file holds all of them in order."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "a"})
        held = _seal_held(writer, "b")
        entry = _returns_within(lambda: writer.append({"kind": "c"}), 10)
        assert isinstance(entry, LedgerEntry)
        assert (entry.seq, writer.ready_seq, writer.durable_seq) == (3, 3, 3)
        assert _seqs(path) == [1, 2, 3]
        assert path.read_bytes().splitlines(keepends=True)[1] == held.line
    assert verify(path).entries == 3


def test_session_sync_returns_promptly_while_a_turn_is_held(tmp_path: Path) -> None:
    """`SessionLedgers.sync` never waits for a held line: it returns at once with the seqs just
    before it durable (a later turn already released stays behind it), and leaves both turns
    out of both files until the first is released."""
    with (
        GroupSyncer(sync=_no_sync) as syncer,
        SessionLedgers.create(root=tmp_path, tier="t", session_id="S", syncer=syncer) as ledgers,
    ):
        ledgers.record_turn(turn_number=1, query_hash="q1", result_hash="r1", status="succeeded")
        held = _seal_turn(ledgers, 2)
        ledgers.release(_seal_turn(ledgers, 3))  # committed, behind turn 2
        assert (ledgers.exec.head[0], ledgers.exec.ready_seq, ledgers.evidence.ready_seq) == (
            4,
            2,
            2,
        )
        assert _returns_within(ledgers.sync, 10) == (2, 2)
        assert (ledgers.exec.durable_seq, ledgers.evidence.durable_seq) == (2, 2)
        assert _turn_numbers(ledgers.exec_path) == _turn_numbers(ledgers.evidence_path) == [1]
        ledgers.release(held)
        assert _returns_within(ledgers.sync, 10) == (4, 4)
        assert _turn_numbers(ledgers.exec_path) == [1, 2, 3]
        assert _turn_numbers(ledgers.evidence_path) == [1, 2, 3]
    assert [report.entries for report in verify_session_dir(ledgers.session_dir)] == [4, 4]


def test_close_drops_held_lines(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """Closing with held lines leaves them out of the file and logs
    ``ledger_held_lines_dropped`` with their seqs; the file verifies and a reopen continues
    after the last line written."""
    path = tmp_path / "l.jsonl"
    writer = open_ledger(path, ledger_id="L", syncer=quick_syncer)
    first = writer.append({"kind": "a"})
    held = [_seal_held(writer, "b"), _seal_held(writer, "c")]
    with structlog.testing.capture_logs() as logs:
        writer.close()
    dropped = [log for log in logs if log["event"] == "ledger_held_lines_dropped"]
    assert [log["seqs"] for log in dropped] == [[line.seq for line in held]]
    assert _seqs(path) == [1]
    report = verify(path)
    assert (report.entries, report.head_hash, report.anchored_seq) == (1, first.entry_hash, 1)
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as again:
        assert again.head == (1, first.entry_hash)
        assert again.append({"kind": "d"}).seq == 2
    assert verify(path).entries == 2


_HELD_CHILD = """
import os, signal, sys
from pathlib import Path
from ledger import GroupSyncer, SessionLedgers
root, out = Path(sys.argv[1]), int(sys.argv[2])
syncer = GroupSyncer()  # the daemon's syncer, real fdatasync
ledgers = SessionLedgers.create(root=root, tier="t", session_id="S", syncer=syncer)

def seal(turn):
    return ledgers.seal_turn(
        turn_number=turn, query_hash=f"q{turn}", result_hash=f"r{turn}", status="succeeded",
        external_calls=[{"attempt": 1, "outcome": "SUCCESS", "decision": "SUCCEED"}],
    )

first = seal(1)
ledgers.release(first)  # the store committed turn 1
ledgers.flush()
ledgers.sync()
seal(2)  # turn 2's commit is still due when the process dies
synced = ledgers.sync()  # the daemon's sync round
ledgers.flush()  # another turn's ending
os.write(out, f"ready {synced[0]} {synced[1]}\\n".encode())
while True:
    signal.pause()
"""


def test_sigkill_with_a_turn_held_leaves_it_out_of_both_files(tmp_path: Path) -> None:
    """A real SIGKILL while turn 2's lines are held (after a sync round and a flush): both
    files hold turn 1's entries and no entry of turn 2, both verify, and reopen continues."""
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", _HELD_CHILD, str(tmp_path), str(write_fd)],
        pass_fds=(write_fd,),
        stderr=subprocess.PIPE,
    )
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 30)
        message = os.read(read_fd, 100) if ready else b""
    finally:
        os.close(read_fd)
        child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=60)
    assert message == b"ready 2 2\n", stderr.decode(errors="replace")
    assert child.returncode == -signal.SIGKILL
    session_dir = tmp_path / "planes" / "t" / "sessions" / "S"
    exec_path, evidence_path = (
        session_dir / "ledger/exec.jsonl",
        session_dir / "ledger/evidence.jsonl",
    )
    assert _turn_numbers(exec_path) == _turn_numbers(evidence_path) == [1]
    assert [report.entries for report in verify_session_dir(session_dir)] == [2, 2]
    with SessionLedgers.open(
        root=tmp_path, tier="t", session_id="S", syncer=InlineSyncer(sync=_no_sync)
    ) as ledgers:
        assert ledgers.exec.head[0] == ledgers.evidence.head[0] == 2
        ledgers.record_turn(turn_number=2, query_hash="q2", result_hash="r2", status="succeeded")
    assert [report.entries for report in verify_session_dir(session_dir)] == [3, 3]
