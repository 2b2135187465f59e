"""Sandboxed process turns of ``/bin/true`` beside bubblewrap and a bare ``posix_spawn``.

The daemon's side is ``benchmarks/bench_sandbox.py``'s: its launcher timer and its turn loop on
the daemon's path (a turn's ending and both ledger lines in one store commit) are called here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_sandbox
from ledger import GroupSyncer
from sandbox.helper.remote import HelperClient
from sandbox.runtime import Runtime


def bwrap_argv(writable: Path) -> list[str]:
    """bubblewrap's policy for the comparison: the root file system bound read-only, one
    writable directory (the working directory), a new network namespace (no network), a new pid
    namespace, and the sandbox dies with its parent."""
    binary = shutil.which("bwrap")
    if binary is None:
        raise RuntimeError("bwrap is not installed (Debian: apt-get install bubblewrap)")
    return [
        binary,
        "--ro-bind", "/", "/",
        "--bind", str(writable), str(writable),
        "--chdir", str(writable),
        "--unshare-net",
        "--unshare-pid",
        "--die-with-parent",
        "/bin/true",
    ]  # fmt: skip


def bwrap_spawn(argv: list[str]) -> Callable[[], None]:
    """posix_spawn bwrap running /bin/true and wait for it; a failure raises."""

    def run() -> None:
        pid = os.posix_spawn(argv[0], argv, dict(os.environ))
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"bwrap exited with {os.waitstatus_to_exitcode(status)}")

    return run


@dataclass(frozen=True, slots=True)
class HunterFigures:
    """Medians of one round (milliseconds) and the enforcement the runtime reported."""

    launcher_ms: float
    turn_ms: float
    enforcement: str
    #: the same turn with the root sandbox helper doing the confinement (the shipped units)
    helper_turn_ms: float = 0.0


@contextmanager
def sandbox_root() -> Iterator[Path]:
    """A runtime root with bench_sandbox's package (writes anywhere in its output, executes
    /bin/true); removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="hh-compare-sandbox-"))
    work.chmod(0o711)  # turns run as another uid: keep it traversable
    try:
        pkg = work / "root" / "installed" / "bench"
        pkg.mkdir(parents=True)
        manifest = {"capabilities": {"read": [], "write": ["**"], "execute": ["/bin/true"]}}
        (pkg / "manifest.json").write_text(json.dumps(manifest))
        (work / "bwrap-writable").mkdir()
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def hunter_round(work: Path, turns: int, round_no: int) -> HunterFigures:
    """A fresh runtime and session; 20 warm-up turns; the launcher alone (confined spawn) and
    the full turn on the daemon's path, *turns* each."""
    syncer = GroupSyncer()
    try:
        with Runtime(work / "root", syncer=syncer) as runtime:
            enforcement = ",".join(f"{k}={v}" for k, v in sorted(runtime.levels.items()))
            with runtime.open_session("bench") as session:
                await bench_sandbox.time_turns(session, 20)
                launcher = bench_sandbox.confined_spawn_timer(session)
                launcher_ms = bench_sandbox.median_ms(bench_sandbox.time_sync(launcher, turns))
                samples = await bench_sandbox.time_turns_store(
                    session, work / f"turns-{round_no}.sqlite3", turns
                )
        helper_syncer = GroupSyncer()
        try:
            with bench_sandbox.helper_process(work / f"helper-{round_no}") as sock:
                helper = HelperClient(sock)
                with (
                    Runtime(work / "root", syncer=helper_syncer, helper=helper) as runtime,
                    runtime.open_session("bench") as session,
                ):
                    await bench_sandbox.time_turns(session, 20)
                    via_helper = await bench_sandbox.time_turns_store(
                        session, work / f"turns-helper-{round_no}.sqlite3", turns
                    )
        finally:
            helper_syncer.close()
    finally:
        syncer.close()
    return HunterFigures(
        launcher_ms=launcher_ms,
        turn_ms=bench_sandbox.median_ms(samples),
        enforcement=enforcement,
        helper_turn_ms=bench_sandbox.median_ms(via_helper),
    )


def spawn_median_ms(fn: Callable[[], None], runs: int) -> float:
    """Median of *runs* calls after 10 warm-up calls (milliseconds)."""
    bench_sandbox.time_sync(fn, 10)
    return bench_sandbox.median_ms(bench_sandbox.time_sync(fn, runs))
