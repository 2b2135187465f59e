"""Ledger benchmark: durable append throughput, group commit, verification speed.

Run: ``python benchmarks/bench_ledger.py`` (about 30-60 s). Prints figures and ratios measured in
this one run on this machine; the targets from issue 3 are printed next to them:

1. durable appends/s with one fdatasync per entry (one ledger, one appender);
2. durable appends/s with 64 ledgers appended concurrently through one GroupSyncer
   (target: >= 20x the first figure), and the daemon's own path (e.): a turn's two lines
   commit with its ending in the turn store, one group commit for every session;
3. verify entries/s against a raw baseline that only reads, parses (orjson) and sha256-hashes
   the same file (target: >= 60% of the baseline, best of several runs each);
4. verify of 64 sessions in parallel worker processes vs serially.

Not a test: figures depend on the disk and on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import orjson

from ledger import GroupSyncer, InlineSyncer, SessionLedgers, open_ledger, verify, verify_root

_TURN: dict[str, object] = {
    "kind": "turn",
    "session_id": "SES-20261122T120000.000000Z-4f9c2a",
    "turn_number": 1,
    "query_hash": "a" * 64,
    "result_hash": "b" * 64,
    "status": "succeeded",
}


def _no_sync(fd: int) -> None:
    """Used only to build input files for the verification figures quickly."""


def _timed_appends(append: Callable[[], None], seconds: float) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        append()
        count += 1
    return count / (time.perf_counter() - start)


def bench_per_entry_fsync(directory: Path, seconds: float) -> float:
    """One ledger, one appender, one fdatasync per entry."""
    with open_ledger(directory / "single.jsonl", ledger_id="bench/exec") as writer:
        return _timed_appends(lambda: _append(writer), seconds)


def _append(writer: object) -> None:
    writer.append(_TURN)  # type: ignore[attr-defined]


def bench_group_commit(
    directory: Path, seconds: float, *, ledgers: int, per_ledger: int, mode: str
) -> tuple[float, str]:
    """``ledgers`` ledgers with ``per_ledger`` appender threads each, through one GroupSyncer."""
    with GroupSyncer(mode="auto" if mode == "auto" else "fdatasync") as syncer:
        writers = [
            open_ledger(
                directory / f"{mode}-{per_ledger}-{index}.jsonl",
                ledger_id=f"g{index}",
                syncer=syncer,
            )
            for index in range(ledgers)
        ]
        threads_total = ledgers * per_ledger
        counts = [0] * threads_total
        stop = threading.Event()
        ready = threading.Barrier(threads_total + 1)

        def work(index: int) -> None:
            writer = writers[index % ledgers]
            ready.wait()
            while not stop.is_set():
                writer.append(_TURN)
                counts[index] += 1

        threads = [threading.Thread(target=work, args=(index,)) for index in range(threads_total)]
        for thread in threads:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        stop.wait(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
        for writer in writers:
            writer.close()
        stats = syncer.statistics()
    detail = (
        f"batches {stats.batches}, fdatasync {stats.fdatasync_calls}, syncfs {stats.syncfs_calls},"
        f" {stats.sync_seconds:.1f} s in sync calls"
    )
    return sum(counts) / elapsed, detail


def bench_group_commit_async(
    directory: Path, seconds: float, *, ledgers: int, per_ledger: int
) -> tuple[float, str]:
    """``ledgers`` ledgers with ``per_ledger`` asyncio tasks each awaiting ``aappend``."""
    with GroupSyncer() as syncer:
        writers = [
            open_ledger(directory / f"async-{index}.jsonl", ledger_id=f"a{index}", syncer=syncer)
            for index in range(ledgers)
        ]
        counts = [0] * (ledgers * per_ledger)

        async def work(index: int, deadline: float) -> None:
            writer = writers[index % ledgers]
            while time.perf_counter() < deadline:
                await writer.aappend(_TURN)
                counts[index] += 1

        async def run_all() -> float:
            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for index in range(ledgers * per_ledger):
                    group.start_soon(work, index, start + seconds)
            return time.perf_counter() - start

        elapsed = anyio.run(run_all)
        for writer in writers:
            writer.close()
        stats = syncer.statistics()
    detail = (
        f"batches {stats.batches}, fdatasync {stats.fdatasync_calls}, syncfs {stats.syncfs_calls},"
        f" {stats.sync_seconds:.1f} s in sync calls"
    )
    return sum(counts) / elapsed, detail


def bench_store_commit(
    directory: Path, seconds: float, *, sessions: int, per_session: int
) -> tuple[float, str]:
    """The daemon's path: each turn ending seals its exec and evidence lines (no sync of their
    own) and commits them with the ending in the turn store (SQLite WAL, synchronous=FULL,
    group commit); ``sessions`` sessions, ``per_session`` concurrent turns each. Counts ledger
    entries made durable per second (two per ending). The files are synced afterwards, in
    rounds, as the daemon does; that round is not counted here."""
    from sandbox.policy.attempt_record import AttemptRecord
    from sandbox.policy.envelopes import ExecutorCommandType
    from sandbox.policy.lifecycle import TurnState
    from supervisor.store.protocol import NewSession, NewTurn, TurnEnding
    from supervisor.store.sqlite import open_sqlite_store
    from supervisor.wire.turn_spec import InstructionSpec

    _READ_SPEC = InstructionSpec(timeout_ms=1_000, command_type=ExecutorCommandType.READ)

    root = directory / "store-path"
    with GroupSyncer() as syncer:
        ledgers = [
            SessionLedgers.create(root=root, tier="default", session_id=f"S{i}", syncer=syncer)
            for i in range(sessions)
        ]
        entries = 0
        stats_line = ""

        async def run_all() -> float:
            nonlocal entries, stats_line
            async with open_sqlite_store(root / "state" / "turns.sqlite3") as store:
                for session in ledgers:
                    await store.open_session(
                        NewSession(session_id=session.session_id, package_id="p")
                    )

                async def work(session: SessionLedgers, deadline: float) -> None:
                    nonlocal entries
                    while time.perf_counter() < deadline:
                        accepted = await store.accept(
                            NewTurn(session_id=session.session_id, spec=_READ_SPEC),
                            claim_for="bench",
                        )
                        assert accepted.claim is not None
                        lines = session.seal_turn(
                            turn_number=accepted.turn.turn_number,
                            query_hash="a" * 64,
                            result_hash="b" * 64,
                            status="succeeded",
                        )
                        await store.finish(
                            accepted.claim,
                            TurnEnding(state=TurnState.SUCCEEDED),
                            [AttemptRecord(attempt=1, started_us=0, decision="SUCCEED")],
                            ledger_lines=lines,
                            started=AttemptRecord(attempt=1, started_us=0),
                        )
                        session.release(lines)
                        session.flush()
                        entries += 2

                start = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for session in ledgers:
                        for _ in range(per_session):
                            group.start_soon(work, session, start + seconds)
                elapsed = time.perf_counter() - start
                stats = store.statistics()
                stats_line = (
                    f"commits {stats.commits}, store writes {stats.operations} (accept and"
                    f" ending per turn), {stats.operations / max(1, stats.commits):.0f} per"
                    " commit; CPU-bound"
                )
            return elapsed

        elapsed = anyio.run(run_all)
        for session in ledgers:
            session.close()
    return entries / elapsed, stats_line


def _raw_baseline(path: Path) -> int:
    """Read, parse every line with orjson, sha256 it: the floor any verifier pays."""
    count = 0
    for line in path.read_bytes().split(b"\n")[:-1]:
        orjson.loads(line)
        hashlib.sha256(line).hexdigest()
        count += 1
    return count


def bench_verify(directory: Path, entries: int, runs: int) -> tuple[float, float]:
    """Best-of-``runs`` entries/s of verify and of the raw baseline on the same file."""
    path = directory / "big.jsonl"
    with open_ledger(path, ledger_id="big/exec", syncer=InlineSyncer(sync=_no_sync)) as writer:
        for turn in range(1, entries + 1):
            writer.write_entry({**_TURN, "turn_number": turn})
    best_verify = best_base = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        counted = _raw_baseline(path)
        best_base = min(best_base, time.perf_counter() - start)
        start = time.perf_counter()
        report = verify(path)
        best_verify = min(best_verify, time.perf_counter() - start)
        assert counted == report.entries == entries
    return entries / best_verify, entries / best_base


def bench_verify_sessions(root: Path, sessions: int, turns: int) -> tuple[float, float, int]:
    """Seconds to verify every session under ``root`` serially and in parallel."""
    syncer = InlineSyncer(sync=_no_sync)
    for index in range(sessions):
        with SessionLedgers.create(
            root=root, tier="bench", session_id=f"SES-{index:03d}", syncer=syncer
        ) as ledgers:
            for turn in range(1, turns + 1):
                ledgers.exec.write_entry(
                    {**_TURN, "session_id": f"SES-{index:03d}", "turn_number": turn}
                )
                ledgers.evidence.write_entry(
                    {
                        "kind": "turn",
                        "session_id": f"SES-{index:03d}",
                        "turn_number": turn,
                        "declared_reads": ["inputs/in.txt"],
                        "declared_writes": [{"path": "outputs/out.txt", "role": "result"}],
                        "external_calls": [],
                        "capability_violations": [],
                    }
                )
    start = time.perf_counter()
    serial = verify_root(root, workers=1)
    serial_s = time.perf_counter() - start
    workers = len(os.sched_getaffinity(0))
    start = time.perf_counter()
    parallel = verify_root(root, workers=workers)
    parallel_s = time.perf_counter() - start
    assert serial.ok
    assert parallel.ok
    assert len(serial.reports) == len(parallel.reports) == 2 * sessions
    return serial_s, parallel_s, workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each append test")
    parser.add_argument("--entries", type=int, default=100_000, help="entries in the verify file")
    parser.add_argument("--runs", type=int, default=7, help="verify runs (best counts)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4000, help="turns per session")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-ledger-") as tmp:
        directory = Path(tmp)
        print(f"ledger benchmark in {directory} (cpus: {len(os.sched_getaffinity(0))})")
        first = bench_per_entry_fsync(directory, args.seconds)
        grouped, detail = bench_group_commit(
            directory, args.seconds, ledgers=64, per_ledger=1, mode="auto"
        )
        deep, deep_detail = bench_group_commit(
            directory, args.seconds, ledgers=64, per_ledger=4, mode="auto"
        )
        tasks, tasks_detail = bench_group_commit_async(
            directory, args.seconds, ledgers=64, per_ledger=8
        )
        plain, plain_detail = bench_group_commit(
            directory, args.seconds, ledgers=64, per_ledger=1, mode="fdatasync"
        )
        store_rate, store_detail = bench_store_commit(
            directory, args.seconds, sessions=64, per_session=2
        )
        second = bench_per_entry_fsync(directory, args.seconds)
        single = (first + second) / 2
        print(
            f"1. durable appends, one fdatasync per entry:    {single:9.0f} /s"
            f"   (runs before/after the group tests: {first:.0f}, {second:.0f})"
        )
        print("2. durable appends, 64 ledgers through one GroupSyncer (target >= 20x of 1.):")
        print(
            f"   a. 1 appender per ledger, auto mode:          {grouped:9.0f} /s"
            f"   ratio {grouped / single:5.1f}x  [{detail}]"
        )
        print(
            f"   b. 4 appenders per ledger, auto mode:         {deep:9.0f} /s"
            f"   ratio {deep / single:5.1f}x  [{deep_detail}]"
        )
        print(
            f"   c. 8 asyncio tasks per ledger (aappend):      {tasks:9.0f} /s"
            f"   ratio {tasks / single:5.1f}x  [{tasks_detail}]"
        )
        print(
            f"   d. 1 appender per ledger, fdatasync-only:     {plain:9.0f} /s"
            f"   ratio {plain / single:5.1f}x  [{plain_detail}]"
        )
        print(
            f"   e. the daemon's path: both lines of a turn commit with its ending in the turn"
            f" store\n      (64 sessions x 2 turns in flight):            {store_rate:9.0f} /s"
            f"   ratio {store_rate / single:5.1f}x  [{store_detail}]"
        )
        verified, baseline = bench_verify(directory, args.entries, args.runs)
        print(
            f"3. verify, {args.entries} entries, best of {args.runs}: {verified:9.0f} entries/s"
            f"   raw baseline {baseline:.0f}/s, ratio {verified / baseline:.1%} (target >= 60%)"
        )
        serial_s, parallel_s, workers = bench_verify_sessions(
            directory / "root", args.sessions, args.turns
        )
        total = args.sessions * 2 * (args.turns + 1)
        print(
            f"4. verify {args.sessions} sessions ({total} entries): serial {serial_s:.2f} s, "
            f"parallel ({workers} workers) {parallel_s:.2f} s, "
            f"speed-up {serial_s / parallel_s:.2f}x"
        )


if __name__ == "__main__":
    main()
