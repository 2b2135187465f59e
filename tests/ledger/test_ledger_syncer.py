"""Tests of ledger.syncer: group commit across ledgers and fatal sync failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from ledger import GroupSyncer, LedgerClosedError, LedgerSyncError, open_ledger, verify


def test_group_syncer_shares_syncs_across_ledgers(tmp_path: Path) -> None:
    """Many ledgers appended concurrently: all acknowledged, fewer syncs than appends."""
    with GroupSyncer() as syncer:
        writers = [
            open_ledger(tmp_path / f"l{index}.jsonl", ledger_id=f"L{index}", syncer=syncer)
            for index in range(16)
        ]

        def work(index: int) -> None:
            for _ in range(10):
                writers[index % 16].append({"kind": "a"})

        threads = [threading.Thread(target=work, args=(index,)) for index in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for writer in writers:
            writer.close()
        stats = syncer.statistics()
    assert stats.failures == 0
    assert stats.fdatasync_calls + stats.syncfs_calls < 320
    for index in range(16):
        assert verify(tmp_path / f"l{index}.jsonl").entries == 20


def test_group_syncer_fdatasync_mode_counts(tmp_path: Path) -> None:
    """In fdatasync mode each synced ledger costs one fdatasync per batch."""
    with GroupSyncer(mode="fdatasync") as syncer:
        with open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=syncer) as writer:
            writer.append({"kind": "a"})
            writer.append({"kind": "b"})
        stats = syncer.statistics()
    assert stats.syncfs_calls == 0
    assert stats.fdatasync_calls == stats.ledgers_synced == 2


def test_injected_sync_failure_fails_only_that_ledger(tmp_path: Path) -> None:
    """A failing fdatasync fails its ledger for good; other ledgers carry on."""
    bad_inodes: set[int] = set()
    calls: list[int] = []

    def sync(fd: int) -> None:
        calls.append(fd)
        if os.fstat(fd).st_ino in bad_inodes:
            raise OSError(5, "Input/output error")
        os.fdatasync(fd)

    with GroupSyncer(sync=sync) as syncer:
        good = open_ledger(tmp_path / "good.jsonl", ledger_id="G", syncer=syncer)
        bad = open_ledger(tmp_path / "bad.jsonl", ledger_id="B", syncer=syncer)
        bad.append({"kind": "a"})
        bad_inodes.add((tmp_path / "bad.jsonl").stat().st_ino)
        with pytest.raises(LedgerSyncError, match=r"bad\.jsonl: ledger failed"):
            bad.append({"kind": "b"})
        failed_calls = len(calls)
        with pytest.raises(LedgerSyncError):
            bad.append({"kind": "c"})
        assert len(calls) == failed_calls  # never retried
        good.append({"kind": "a"})
        good.close()
        bad.close()
        assert syncer.statistics().failures == 1
    assert verify(tmp_path / "good.jsonl").entries == 1


def test_injected_syncfs_failure_fails_the_batch(tmp_path: Path) -> None:
    """When a syncfs batch fails, every ledger in it fails."""

    def syncfs(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with GroupSyncer(syncfs=syncfs, mode="syncfs", syncfs_min_ledgers=1) as syncer:
        writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=syncer)
        with pytest.raises(LedgerSyncError, match=r"syncfs: OSError: \[Errno 28\]"):
            writer.append({"kind": "a"})
        writer.close()


def test_closed_group_syncer_refuses(tmp_path: Path) -> None:
    """Appending through a closed syncer raises LedgerClosedError."""
    syncer = GroupSyncer()
    writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=syncer)
    syncer.close()
    syncer.close()
    with pytest.raises(LedgerClosedError):
        writer.append({"kind": "a"})
    writer.close()


async def test_async_appends_share_batches(tmp_path: Path) -> None:
    """aappend under asyncio awaits the group syncer without a thread per waiter."""
    with GroupSyncer() as syncer:
        writers = [
            open_ledger(tmp_path / f"l{index}.jsonl", ledger_id=f"L{index}", syncer=syncer)
            for index in range(8)
        ]

        async def work(index: int) -> None:
            for _ in range(5):
                await writers[index % 8].aappend({"kind": "a"})

        async with anyio.create_task_group() as group:
            for index in range(32):
                group.start_soon(work, index)
        for writer in writers:
            writer.close()
        stats = syncer.statistics()
    assert stats.batches < 160
    assert all(verify(tmp_path / f"l{index}.jsonl").entries == 20 for index in range(8))


async def test_async_append_sync_failure(tmp_path: Path) -> None:
    """A failing sync reaches the awaiting task as LedgerSyncError and fails the ledger."""

    def sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with GroupSyncer(sync=sync) as syncer:
        writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=syncer)
        with pytest.raises(LedgerSyncError, match=r"Input/output error"):
            await writer.aappend({"kind": "a"})
        with pytest.raises(LedgerSyncError, match=r"Input/output error"):
            await writer.aappend({"kind": "b"})
        writer.close()


def test_unexpected_sync_exception_fails_instead_of_hanging(tmp_path: Path) -> None:
    """A sync function raising something other than OSError fails the ledger, never hangs."""

    def sync(fd: int) -> None:
        raise RuntimeError("boom")

    with GroupSyncer(sync=sync) as syncer:
        writer = open_ledger(tmp_path / "l.jsonl", ledger_id="L", syncer=syncer)
        with pytest.raises(LedgerSyncError, match=r"syncer error: RuntimeError: boom$"):
            writer.append({"kind": "a"})
        writer.close()
