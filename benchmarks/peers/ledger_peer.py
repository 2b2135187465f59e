"""Ledger verification beside the raw read + parse + hash baseline, serial and parallel.

``benchmarks/bench_ledger.py`` builds the ledgers and times ``verify``/``verify_root``; the
raw baseline of the many-session case (its ``_raw_baseline`` over the same files, serially and in
as many worker processes as ``verify_root`` uses) is added here.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_ledger


@dataclass(frozen=True, slots=True)
class LedgerFigures:
    """Entries per second of one round."""

    verify_one: float
    raw_one: float
    verify_serial: float
    raw_serial: float
    verify_parallel: float
    raw_parallel: float
    workers: int
    entries_one: int
    entries_many: int


def _raw_files(files: list[Path], workers: int) -> tuple[int, float]:
    start = time.perf_counter()
    if workers == 1:
        counted = sum(bench_ledger._raw_baseline(path) for path in files)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            counted = sum(pool.map(bench_ledger._raw_baseline, files, chunksize=4))
    return counted, time.perf_counter() - start


def ledger_round(*, entries: int, sessions: int, turns: int) -> LedgerFigures:
    """One file of *entries* entries (verify vs raw, one run each), then *sessions* sessions of
    *turns* turns (two ledgers each): verify_root and the raw baseline, serial and parallel."""
    directory = Path(tempfile.mkdtemp(prefix="hh-compare-ledger-"))
    try:
        verify_one, raw_one = bench_ledger.bench_verify(directory, entries, 1)
        root = directory / "root"
        serial_s, parallel_s, workers = bench_ledger.bench_verify_sessions(root, sessions, turns)
        files = sorted(root.rglob("*.jsonl"))
        counted, raw_serial_s = _raw_files(files, 1)
        counted_parallel, raw_parallel_s = _raw_files(files, workers)
        if counted != counted_parallel:
            raise RuntimeError(f"raw baseline counted {counted} then {counted_parallel} entries")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return LedgerFigures(
        verify_one=verify_one,
        raw_one=raw_one,
        verify_serial=counted / serial_s,
        raw_serial=counted / raw_serial_s,
        verify_parallel=counted / parallel_s,
        raw_parallel=counted / raw_parallel_s,
        workers=workers,
        entries_one=entries,
        entries_many=counted,
    )
