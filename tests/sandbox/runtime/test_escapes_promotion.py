"""Promotion under attack: a full disk is an I/O fault (not a violation), and promotion of a
turn's outputs is all or nothing. The disk is a real, small tmpfs (needs root to mount)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.enumerate import enumerate_writes
from sandbox.promote import PromotionError, promote_outputs
from sandbox.runtime import Runtime

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
TIMEOUT_MS = 10_000


@pytest.fixture
def small_disk(world: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted in ``world`` (unmounted afterwards)."""
    mount_point = world / "small-disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount_point)],
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def listing(directory: Path) -> list[str]:
    """Every path under *directory*, relative, sorted (hidden temporaries included)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


async def test_disk_full_during_promotion_is_an_io_fault_and_promotes_nothing(
    root: Path, install: Installer, small_disk: Path
) -> None:
    """Two declared outputs, the second too big for the workspace's disk: the turn ends as a
    RESOURCE_EXHAUSTED I/O fault (escalated, no capability violation), and the workspace is
    exactly as before: the first output is not promoted, the old file is intact, no directory
    or temporary file is left."""
    install("pkg")
    workspace = small_disk / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("old\n")
    before = listing(workspace)
    with Runtime(root) as runtime, runtime.open_session("pkg", workspace=workspace) as session:
        script = (
            'echo new > "$HUNTER_OUTPUT_DIR/a.txt"; mkdir -p "$HUNTER_OUTPUT_DIR/sub"; '
            'head -c 262144 /dev/zero > "$HUNTER_OUTPUT_DIR/sub/big.bin"'
        )
        result = await session.run_process_turn(
            ["/bin/sh", "-c", script],
            declared_outputs=[{"path": "a.txt"}, {"path": "sub/big.bin"}],
            timeout_ms=TIMEOUT_MS,
        )
        assert result.attempts[0].exit_code == 0, result.stderr
        assert result.reason_code == "PROMOTION_IO_FAILED", result.reason
        assert "No space left on device" in result.reason
        assert result.fault_type == "RESOURCE_EXHAUSTED"
        assert result.status == "escalated"
        assert result.violations == ()
        assert result.promoted_outputs == ()
        evidence = session.ledgers.session_dir / "ledger" / "evidence.jsonl"
        kinds = [json.loads(line)["kind"] for line in evidence.read_text().splitlines()]
        assert "capability_violation" not in kinds
    assert listing(workspace) == before
    assert (workspace / "a.txt").read_text() == "old\n"


def test_a_refused_output_rolls_back_the_ones_before_it(world: Path) -> None:
    """Same filesystem (outputs renamed, not copied): when the second output is refused (its
    destination leaves the workspace through a symlink), the first is put back where it was
    and the file it would have replaced is untouched."""
    src = world / "out"
    (src / "esc").mkdir(parents=True)
    (src / "a.txt").write_text("new\n")
    (src / "esc" / "b.txt").write_text("b\n")
    workspace = world / "ws"
    workspace.mkdir()
    outside = world / "elsewhere"
    outside.mkdir()
    (workspace / "a.txt").write_text("old\n")
    (workspace / "esc").symlink_to(outside)
    surface = enumerate_writes({"output": src})
    writes = surface.in_area("output")
    done: list[object] = []
    with pytest.raises(PromotionError, match=r"^esc/b\.txt: destination leaves the workspace"):
        promote_outputs(src, [writes["a.txt"], writes["esc/b.txt"]], workspace, done=done)  # type: ignore[arg-type]
    assert done == []
    assert (workspace / "a.txt").read_text() == "old\n"
    assert (src / "a.txt").read_text() == "new\n"  # back in the sandbox, as enumerated
    assert os.listdir(outside) == []
    assert sorted(os.listdir(workspace)) == ["a.txt", "esc"]


def test_every_output_lands_when_all_can(world: Path) -> None:
    """The commit puts every staged output in place and leaves no temporary file."""
    src = world / "out"
    (src / "d").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "d" / "b.txt").write_text("b\n")
    workspace = world / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("old\n")
    writes = enumerate_writes({"output": src}).in_area("output")
    promoted = promote_outputs(src, [writes["a.txt"], writes["d/b.txt"]], workspace)
    assert [p.path for p in promoted] == ["a.txt", "d/b.txt"]
    assert listing(workspace) == ["a.txt", "d", "d/b.txt"]
    assert (workspace / "a.txt").read_text() == "a\n"
