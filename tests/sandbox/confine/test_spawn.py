"""The launcher: exit codes, setup errors by stage, uid drop, network namespaces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.confine.spawn import (
    SpawnRequest,
    native_available,
    new_network_namespace,
    reap,
    spawn,
)
from sandbox.errors import SpawnError

pytestmark = pytest.mark.usefixtures("sandboxed")


def run(launcher: str, script: str, **kwargs: object) -> tuple[int, str]:
    """Run ``sh -c script`` with the given launcher; return exit code and output."""
    out = os.memfd_create("out")
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        child = spawn(
            SpawnRequest(
                path="/bin/sh",
                argv=("sh", "-c", script),
                env=(("PATH", "/usr/bin:/bin"), ("X", "y")),
                cwd="/",
                stdin_fd=null,
                stdout_fd=out,
                stderr_fd=out,
                **kwargs,  # type: ignore[arg-type]
            ),
            launcher=launcher,
        )
        status = reap(child)
        os.close(child.pidfd)
        assert child.launcher == launcher
        return os.waitstatus_to_exitcode(status), os.pread(out, 65536, 0).decode()
    finally:
        os.close(out)
        os.close(null)


@pytest.mark.parametrize("launcher", ["native", "python"])
def test_exit_code_env_uid_and_session(launcher: str) -> None:
    """The child gets exactly the env given, the uid/gid asked for and its own session."""
    if launcher == "native" and not native_available():
        pytest.skip("sandbox._spawn was not built (no C compiler at install time)")
    rc, out = run(
        launcher,
        'echo "$X"; id -u; id -g; id -G; ps -o sid= -p $$ | tr -d " "; echo $$; exit 7',
        uid=250001,
        gid=250001,
        rlimits=((4, 0, 0),),
    )
    x, uid, gid, groups, sid, pid = out.split()
    assert rc == 7
    assert (x, uid, gid, groups) == ("y", "250001", "250001", "250001")
    assert sid == pid


def test_setup_failure_names_the_stage() -> None:
    """A failing step raises SpawnError with the stage instead of running the command."""
    with pytest.raises(SpawnError, match=r"^\[Errno 2\] sandbox child failed at execve") as info:
        spawn(
            SpawnRequest(
                path="/no/such/binary",
                argv=("x",),
                env=(),
                cwd="/",
                stdin_fd=0,
                stdout_fd=1,
                stderr_fd=2,
            ),
            launcher="native" if native_available() else "auto",
        )
    assert info.value.stage == "execve" or not native_available()
    with pytest.raises(SpawnError, match=r"^\[Errno 2\] sandbox child failed at chdir"):
        spawn(
            SpawnRequest(
                path="/bin/true",
                argv=("true",),
                env=(),
                cwd="/no/such/dir",
                stdin_fd=0,
                stdout_fd=1,
                stderr_fd=2,
            ),
            launcher="native",
        )


def test_network_namespace_is_empty_and_separate(tmp_path: Path) -> None:
    """A turn in the namespace sees only a down loopback; the supervisor's netns is unchanged."""
    before = os.readlink("/proc/self/ns/net")
    netns = new_network_namespace()
    try:
        assert os.readlink(f"/proc/self/fd/{netns}") != before
        rc, out = run("native", "cat /proc/net/dev | tail -n +3 | cut -d: -f1", netns_fd=netns)
        assert rc == 0
        assert out.split() == ["lo"]
    finally:
        os.close(netns)
    assert os.readlink("/proc/self/ns/net") == before
