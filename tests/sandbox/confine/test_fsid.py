"""Promotion with the daemon's file-system identity: the root helper is no confused deputy.

The helper (root) promotes into a workspace the unprivileged daemon names. It does so with
the daemon's fsuid/fsgid (`sandbox.confine.fsid`), so the kernel refuses a workspace the daemon
could not write itself, and what it writes belongs to the daemon.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sandbox.confine.fsid import fs_identity
from sandbox.enumerate import enumerate_writes
from sandbox.promote import promote_outputs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setfsuid)")

DAEMON = 4242


def _outputs(world: Path) -> Path:
    """output/<sid> as a turn leaves it: its own uid's files, mode 0700, unreadable to others."""
    out = world / "output"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("alpha")
    (out / "sub" / "b.txt").write_text("beta")
    for path in (out, out / "sub", out / "a.txt", out / "sub" / "b.txt"):
        os.chown(path, 1_900_000_001, 1_900_000_001)
    out.chmod(0o700)
    return out


def test_the_workspace_of_the_daemon_gets_files_the_daemon_owns(world: Path) -> None:
    out = _outputs(world)
    workspace = world / "ws"
    workspace.mkdir()
    os.chown(workspace, DAEMON, DAEMON)
    writes = enumerate_writes({"output": out}).writes
    promoted = promote_outputs(out, writes, workspace, writer=(DAEMON, DAEMON))
    assert [p.path for p in promoted] == ["a.txt", "sub/b.txt"]
    for name in ("a.txt", "sub/b.txt", "sub"):
        st = (workspace / name).stat()
        assert (st.st_uid, st.st_gid) == (DAEMON, DAEMON), name
    assert (workspace / "sub" / "b.txt").read_text() == "beta"
    assert (out / "a.txt").exists()  # copied, never moved out of the turn's area


@pytest.mark.parametrize("target", ["etc-like", "missing-under-root"])
def test_a_workspace_the_daemon_cannot_write_is_refused_by_the_kernel(
    world: Path, target: str
) -> None:
    """A root-owned directory (like /etc): root could write there, the daemon cannot; the
    promotion fails with EACCES and nothing is written."""
    out = _outputs(world)
    guarded = world / "guarded"
    guarded.mkdir(mode=0o755)
    workspace = guarded if target == "etc-like" else guarded / "new" / "ws"
    writes = enumerate_writes({"output": out}).writes
    with pytest.raises(PermissionError):
        promote_outputs(out, writes, workspace, writer=(DAEMON, DAEMON))
    assert sorted(p.name for p in guarded.iterdir()) == []
    # the thread is root again afterwards: its next file belongs to root
    (world / "after").write_text("x")
    assert (world / "after").stat().st_uid == 0


def test_the_identity_is_the_threads_alone(world: Path) -> None:
    """While one thread writes as the daemon, another thread of the process is still root."""
    inside = threading.Event()
    done = threading.Event()
    shared = world / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)

    def as_daemon() -> None:
        with fs_identity(DAEMON, DAEMON):
            (shared / "daemon.txt").write_text("d")
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=as_daemon)
    thread.start()
    assert inside.wait(10)
    (shared / "root.txt").write_text("r")
    done.set()
    thread.join()
    assert (shared / "daemon.txt").stat().st_uid == DAEMON
    assert (shared / "root.txt").stat().st_uid == 0
