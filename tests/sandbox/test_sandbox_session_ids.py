"""Session ids: format, ordering, and no collisions across tasks and processes (FR-RT-004)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel

from sandbox.session_ids import SESSION_ID_RE, is_session_id, new_session_id


def test_format_is_ses_timestamp_random() -> None:
    """Ids look like SES-<UTC timestamp>-<16 hex>."""
    sid = new_session_id(now=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC))
    assert sid.startswith("SES-20260102T030405.678901Z-")
    assert SESSION_ID_RE.fullmatch(sid)
    assert is_session_id(sid)
    assert not is_session_id("SES-../../etc")


def test_ids_sort_by_creation_time() -> None:
    """A later timestamp sorts after an earlier one."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ids = [new_session_id(now=t0 + timedelta(microseconds=i)) for i in range(50)]
    assert ids == sorted(ids)


async def test_no_collisions_across_many_tasks() -> None:
    """Ids made by many concurrent tasks are all distinct."""
    ids: list[str] = []

    async def make() -> None:
        for _ in range(200):
            ids.append(new_session_id())
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(make)
    assert len(ids) == len(set(ids)) == 4000


def test_no_collisions_across_processes() -> None:
    """Ids made at the same time by several processes are all distinct."""
    code = (
        "from sandbox.session_ids import new_session_id\n"
        "print('\\n'.join(new_session_id() for _ in range(5000)))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    ids: list[str] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        ids.extend(out.split())
    assert len(ids) == len(set(ids)) == 20_000
    assert all(is_session_id(sid) for sid in ids)
