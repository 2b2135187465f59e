"""Promotion of declared outputs into the workspace."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox.enumerate import enumerate_writes
from sandbox.promote import PromotionError, promote_outputs


def make_output(tmp_path: Path) -> Path:
    """An output dir with two files."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("alpha")
    (out / "sub" / "b.txt").write_text("beta")
    os.chmod(out / "a.txt", 0o4777)
    return out


def test_promotes_by_rename_on_the_same_filesystem(tmp_path: Path) -> None:
    """Files land at workspace/<path> with their content and no set-id/world-write bits."""
    out = make_output(tmp_path)
    writes = enumerate_writes({"output": out}).writes
    promoted = promote_outputs(out, writes, tmp_path / "ws")
    assert [p.path for p in promoted] == ["a.txt", "sub/b.txt"]
    target = tmp_path / "ws" / "a.txt"
    assert target.read_text() == "alpha"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert not (out / "a.txt").exists()
    assert promoted[0].sha256 == writes[0].sha256


def test_promotes_by_copy_across_filesystems(tmp_path: Path) -> None:
    """Across filesystems the file is copied, hash-checked, fsynced and renamed into place."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to promote across")
    out = make_output(tmp_path)
    writes = enumerate_writes({"output": out}).writes
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as ws:
        promote_outputs(out, writes, Path(ws))
        assert (Path(ws) / "sub" / "b.txt").read_text() == "beta"
        assert sorted(os.listdir(ws)) == ["a.txt", "sub"]


def test_changed_file_is_refused(tmp_path: Path) -> None:
    """A file replaced after enumeration is not promoted."""
    out = make_output(tmp_path)
    writes = enumerate_writes({"output": out}).writes
    (out / "new").write_text("swapped")
    os.replace(out / "new", out / "a.txt")
    with pytest.raises(PromotionError, match=r"^a\.txt: changed since it was enumerated$"):
        promote_outputs(out, writes, tmp_path / "ws")


def test_destination_escaping_the_workspace_is_refused(tmp_path: Path) -> None:
    """A symlinked directory in the workspace cannot redirect a promotion outside it."""
    out = make_output(tmp_path)
    writes = [w for w in enumerate_writes({"output": out}).writes if w.path == "sub/b.txt"]
    ws = tmp_path / "ws"
    ws.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / "sub").symlink_to(elsewhere)
    with pytest.raises(PromotionError, match=r"^sub/b\.txt: destination leaves the workspace"):
        promote_outputs(out, writes, ws)
    assert not (elsewhere / "b.txt").exists()


def test_failed_copy_across_filesystems_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy that fails (e.g. ENOSPC) removes its temporary file beside the destination."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to promote across")
    out = make_output(tmp_path)
    writes = [w for w in enumerate_writes({"output": out}).writes if w.path == "a.txt"]

    def no_space(src: int, dst: int) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sandbox.promote._copy_fd", no_space)
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as ws:
        with pytest.raises(OSError, match=r"^\[Errno 28\] No space left on device$"):
            promote_outputs(out, writes, Path(ws))
        assert os.listdir(ws) == []
    assert (out / "a.txt").read_text() == "alpha"
