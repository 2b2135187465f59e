"""The disk a session can fill has a hard bound while its turns run: ``tmp/<sid>`` and
``output/<sid>`` share one size-limited tmpfs (sandbox/confine/mounts.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.runtime import Runtime, RuntimeConfig
from sandbox.runtime.area import SessionArea

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
TIMEOUT_MS = 10_000


def mounted(path: Path) -> bool:
    """Whether *path* is a mount point in /proc/self/mountinfo."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return any(line.split(" ")[4] == str(path) for line in handle)


async def test_writes_past_disk_mb_fail_at_once_and_the_turn_is_exhausted(
    root: Path, install: Installer
) -> None:
    """With ``disk_mb: 1``, 700 KiB of scratch plus 700 KiB of output cannot both be written
    (ENOSPC while the turn runs, not a check afterwards); the turn is RESOURCE_EXHAUSTED and
    nothing beyond the bound was ever on disk."""
    install("small", limits={"disk_mb": 1})
    with Runtime(root) as runtime, runtime.open_session("small") as session:
        assert runtime.levels["disk"] == "tmpfs"
        script = (
            'head -c 716800 /dev/zero > "$TMPDIR/scratch.bin" && echo tmp-ok; '
            'head -c 716800 /dev/zero > "$HUNTER_OUTPUT_DIR/out.bin" && echo out-ok; exit 0'
        )
        result = await session.run_process_turn(
            ["/bin/sh", "-c", script],
            declared_outputs=[{"path": "out.bin"}, {"path": "tmp/**", "role": "scratch"}],
            timeout_ms=TIMEOUT_MS,
        )
        assert result.stdout.split() == ["tmp-ok"], result.stderr
        assert "No space left on device" in result.stderr
        assert result.fault_type == "RESOURCE_EXHAUSTED"
        assert result.status == "escalated"
        written = sum(w.size for w in result.attempts[0].realized_writes)
        assert written <= 1 << 20


async def test_the_session_disk_is_mounted_while_open_and_gone_after_close(
    root: Path, install: Installer
) -> None:
    """Both areas are mount points of one filesystem while the session is open; closing it
    detaches them and removes the directories."""
    install("pkg")
    with Runtime(root) as runtime:
        session = runtime.open_session("pkg")
        with session:
            area = session.area
            assert isinstance(area, SessionArea)
            assert mounted(area.tmp_dir)
            assert mounted(area.output_dir)
            assert os.stat(area.tmp_dir).st_dev == os.stat(area.output_dir).st_dev
            assert (os.stat(area.tmp_dir).st_uid, os.stat(area.tmp_dir).st_mode & 0o777) == (
                session.uid,
                0o700,
            )
        assert not mounted(area.tmp_dir)
        assert not mounted(area.disk_dir)
        assert not area.tmp_dir.exists()
        assert not area.disk_dir.exists()


async def test_a_killed_runs_session_disk_is_detached_at_the_next_start(
    root: Path, install: Installer
) -> None:
    """A session never closed (the supervisor was killed) leaves its mounts; the next runtime
    on the root detaches them and removes the directories."""
    install("pkg")
    runtime = Runtime(root)
    session = runtime.open_session("pkg")
    area = session.area
    assert isinstance(area, SessionArea)
    (area.tmp_dir / "left.bin").write_bytes(b"x" * 4096)
    runtime.close()  # releases the root's lock; the session is abandoned, as by a SIGKILL
    try:
        with Runtime(root) as after:
            assert after.leftovers is not None
            assert after.leftovers.errors == ()
            assert after.leftovers.scratch_bytes >= 4096
        assert not mounted(area.tmp_dir)
        assert not mounted(area.output_dir)
        assert not mounted(area.disk_dir)
        assert not area.tmp_dir.exists()
    finally:
        session.ledgers.close()


def test_session_disk_none_keeps_the_post_run_check(root: Path) -> None:
    """``session_disk="none"`` mounts nothing; the level says how disk use is bounded."""
    with Runtime(root, config=RuntimeConfig(session_disk="none")) as runtime:
        assert runtime.levels["disk"] == "post-run-check"
