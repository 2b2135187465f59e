"""Sandbox benchmarks: a full sandboxed turn vs a bare spawn; enumeration vs a raw walk.

Run: ``.venv/bin/python benchmarks/bench_sandbox.py`` (as root, on a machine with Landlock
and cgroups; < 60 s). Targets (issue 4): a sandboxed turn of /bin/true at most 2.0x a bare
posix_spawn of /bin/true; enumeration of 1,000 small files at least 80% of the throughput of
a raw walk + read + sha256.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import structlog

from ledger import GroupSyncer
from sandbox.confine.spawn import SpawnRequest, reap, spawn
from sandbox.enumerate import enumerate_writes
from sandbox.helper.remote import HelperClient
from sandbox.runtime import Runtime, Session
from sandbox.runtime.area import SessionArea


def bare_spawn() -> None:
    """posix_spawn /bin/true and wait for it."""
    pid = os.posix_spawn("/bin/true", ["true"], {})
    os.waitpid(pid, 0)


def median_ms(samples: list[float]) -> float:
    """Median of samples in seconds, as milliseconds."""
    return statistics.median(samples) * 1000


def time_sync(fn: Callable[[], object], n: int) -> list[float]:
    """Run fn n times; return the per-call durations."""
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


async def time_turns(session: Session, n: int) -> list[float]:
    """Run n sandboxed turns of /bin/true; return the per-turn durations."""
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = await session.run_process_turn(["/bin/true"], declared_outputs=[], timeout_ms=5000)
        out.append(time.perf_counter() - t0)
        if result.status != "succeeded":
            raise RuntimeError(f"turn failed: {result.to_dict()}")
    return out


async def time_turns_store(
    session: Session, store_path: Path, n: int, *, runtime_syncs: bool = False
) -> list[float]:
    """The daemon's path: each turn's two ledger lines are sealed by the runtime and commit
    with the turn's ending in the turn store (SQLite WAL, synchronous=FULL): one sync per turn
    for the ending and both entries. Turns are accepted before the clock starts (acceptance is
    the daemon's other durable step, not part of a sandboxed turn). ``runtime_syncs``: the
    daemon's path before issue 8 (the runtime syncs both entries, then the ending commits)."""
    from sandbox.policy.attempt_record import AttemptRecord
    from sandbox.policy.lifecycle import TurnState
    from supervisor.store.protocol import NewSession, NewTurn, TurnEnding
    from supervisor.store.sqlite import open_sqlite_store
    from supervisor.wire.turn_spec import ProcessSpec

    out: list[float] = []
    async with open_sqlite_store(store_path) as store:
        await store.open_session(NewSession(session_id=session.session_id, package_id="bench"))
        claims = []
        for _ in range(n):
            new = NewTurn(
                session_id=session.session_id,
                spec=ProcessSpec(timeout_ms=10_000, argv=("/bin/true",)),
            )
            accepted = await store.accept(new, claim_for="bench")
            assert accepted.claim is not None
            claims.append(accepted.claim)
        for claim in claims:
            t0 = time.perf_counter()
            result = await session.run_process_turn(
                ["/bin/true"],
                declared_outputs=[],
                timeout_ms=5000,
                turn_number=claim.turn.turn_number,
                ledger_commit="sync" if runtime_syncs else "caller",
            )
            lines = result.pending_lines
            await store.finish(
                claim,
                TurnEnding(state=TurnState.SUCCEEDED),
                [AttemptRecord(attempt=1, started_us=0, decision="SUCCEED")],
                ledger_lines=() if lines is None else lines,
                started=AttemptRecord(attempt=1, started_us=0),
            )
            session.flush_ledgers(() if lines is None else lines.lines)
            out.append(time.perf_counter() - t0)
            if result.status != "succeeded":
                raise RuntimeError(f"turn failed: {result.to_dict()}")
    return out


def confined_spawn_timer(session: Session) -> Callable[[], None]:
    """The launcher alone: /bin/true with the session's full confinement, spawned and reaped.

    Same uid drop, network namespace, cgroup leaf, rlimits and Landlock ruleset as a turn,
    without the turn's bookkeeping (checks, enumeration, ledgers).
    """
    area = session.area
    assert isinstance(area, SessionArea)
    area.prepare()
    area.ensure_confinement()
    cg = area.turn_cgroup()
    stdin = session.runtime.stdin_fd()

    def run() -> None:
        fds = cg.open_procs_fds()
        try:
            child = spawn(
                SpawnRequest(
                    path="/usr/bin/true",
                    argv=("/bin/true",),
                    env=area.env(1),
                    cwd=str(session.output_dir),
                    stdin_fd=stdin,
                    stdout_fd=stdin,
                    stderr_fd=stdin,
                    uid=session.uid,
                    gid=session.gid,
                    netns_fd=area.netns_fd,
                    landlock_fd=area.ruleset_fd,
                    cgroup_fds=tuple(fds),
                    rlimits=area.rlimits(),
                )
            )
        finally:
            for fd in fds:
                os.close(fd)
        reap(child)
        os.close(child.pidfd)

    return run


def raw_walk(directory: Path) -> int:
    """Baseline: os.walk + open + read + sha256 of every file."""
    count = 0
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as handle:
                hashlib.sha256(handle.read()).hexdigest()
            count += 1
    return count


def make_files(directory: Path, n: int, size: int) -> None:
    """n files of size bytes in 10 subdirectories."""
    payload = os.urandom(size)
    for i in range(n):
        sub = directory / f"d{i % 10}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}.bin").write_bytes(payload)


@contextlib.contextmanager
def helper_process(work: Path) -> Iterator[Path]:
    """A real `hunter sandbox-helper` (root) on its own root under *work*; its socket."""
    work.mkdir(mode=0o711, parents=True, exist_ok=True)
    sock = work / "helper.sock"
    hroot = work / "helper"
    hroot.mkdir(mode=0o711)
    log = work / "helper.log"
    argv = [sys.executable, "-m", "supervisor", "sandbox-helper", "--root", str(hroot)]
    argv += ["--socket", str(sock), "--allow-user", "0", "--log-format", "json"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 20
        while b"sandbox_helper_ready" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the helper did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> int:
    """Run both benchmarks and print figures and ratios (``--json`` for machines)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    work = Path(tempfile.mkdtemp(prefix="hunter-bench-"))
    work.chmod(0o711)
    results: dict[str, float | str] = {}
    try:
        root = work / "root"
        pkg = root / "installed" / "bench"
        pkg.mkdir(parents=True)
        manifest = {"capabilities": {"read": [], "write": ["**"], "execute": ["/bin/true"]}}
        (pkg / "manifest.json").write_text(json.dumps(manifest))

        async def sandboxed(
            *,
            group_commit: bool,
            store: bool = False,
            runtime_syncs: bool = False,
            helper: Path | None = None,
        ) -> list[float]:
            syncer = GroupSyncer() if group_commit else None
            client = HelperClient(helper) if helper is not None else None
            try:
                with Runtime(root, syncer=syncer, helper=client) as runtime:
                    results["enforcement"] = ",".join(
                        f"{k}={v}" for k, v in sorted(runtime.levels.items())
                    )
                    with runtime.open_session("bench") as session:
                        await time_turns(session, 20)  # warm up (ruleset, netns, cgroup)
                        if helper is not None:
                            return await time_turns(session, args.turns)
                        launcher = confined_spawn_timer(session)
                        results["confined_spawn_ms"] = round(
                            median_ms(time_sync(launcher, args.turns)), 3
                        )
                        if store:
                            return await time_turns_store(
                                session,
                                work / f"turns-{runtime_syncs}.sqlite3",
                                args.turns,
                                runtime_syncs=runtime_syncs,
                            )
                        return await time_turns(session, args.turns)
            finally:
                if syncer is not None:
                    syncer.close()

        time_sync(bare_spawn, 50)
        bare = median_ms(time_sync(bare_spawn, args.turns))
        turn = median_ms(anyio.run(functools.partial(sandboxed, group_commit=False)))
        turn_group = median_ms(anyio.run(functools.partial(sandboxed, group_commit=True)))
        turn_store = median_ms(
            anyio.run(functools.partial(sandboxed, group_commit=True, store=True))
        )
        turn_store_old = median_ms(
            anyio.run(
                functools.partial(sandboxed, group_commit=True, store=True, runtime_syncs=True)
            )
        )
        with helper_process(work) as socket_path:
            via_helper = anyio.run(
                functools.partial(sandboxed, group_commit=False, helper=socket_path)
            )
            in_process = anyio.run(functools.partial(sandboxed, group_commit=False))
        turn_helper = median_ms(via_helper)
        results["sandboxed_turn_helper_ms"] = round(turn_helper, 3)
        results["sandboxed_turn_beside_helper_ms"] = round(median_ms(in_process), 3)
        results["helper_ratio"] = round(turn_helper / median_ms(in_process), 2)
        results["sandboxed_turn_store_ms"] = round(turn_store, 3)
        results["sandboxed_turn_store_before_ms"] = round(turn_store_old, 3)
        results["turn_store_before_ratio"] = round(turn_store_old / bare, 2)
        results["turn_store_ratio"] = round(turn_store / bare, 2)
        results["bare_posix_spawn_ms"] = round(bare, 3)
        results["confined_spawn_ratio"] = round(float(results["confined_spawn_ms"]) / bare, 2)
        results["sandboxed_turn_ms"] = round(turn, 3)
        results["turn_ratio"] = round(turn / bare, 2)
        results["sandboxed_turn_group_commit_ms"] = round(turn_group, 3)
        results["turn_group_commit_ratio"] = round(turn_group / bare, 2)

        tree = work / "files"
        tree.mkdir()
        make_files(tree, args.files, 4096)
        raw_walk(tree)
        enumerate_writes({"output": tree})
        raw = median_ms(time_sync(lambda: raw_walk(tree), 15))
        ours = median_ms(time_sync(lambda: enumerate_writes({"output": tree}), 15))
        results["raw_walk_ms"] = round(raw, 3)
        results["enumerate_ms"] = round(ours, 3)
        results["raw_walk_files_per_s"] = round(args.files / raw * 1000)
        results["enumerate_files_per_s"] = round(args.files / ours * 1000)
        results["enumerate_relative_throughput"] = round(raw / ours, 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"enforcement: {results['enforcement']}")
        print(
            f"bare posix_spawn /bin/true           median {results['bare_posix_spawn_ms']:.3f} ms"
        )
        print(
            f"confined spawn only (launcher)       median {results['confined_spawn_ms']:.3f} ms"
            f"  ratio {results['confined_spawn_ratio']}x"
        )
        print(
            f"full sandboxed turn of /bin/true     median {results['sandboxed_turn_ms']:.3f} ms"
            f"  ratio {results['turn_ratio']}x (target <= 2.0x)"
        )
        print(
            f"  same, ledgers with GroupSyncer     median "
            f"{results['sandboxed_turn_group_commit_ms']:.3f} ms"
            f"  ratio {results['turn_group_commit_ratio']}x"
        )
        print(
            "  through the sandbox helper (daemon unprivileged, helper root)\n"
            f"                                     median {results['sandboxed_turn_helper_ms']:.3f}"
            f" ms  {results['helper_ratio']}x the same turn in-process "
            f"({results['sandboxed_turn_beside_helper_ms']:.3f} ms, measured beside it)"
        )
        store_ms = results["sandboxed_turn_store_ms"]
        before_ms = results["sandboxed_turn_store_before_ms"]
        print(
            "  daemon's path: both lines commit with the ending in the turn store (one sync)\n"
            f"                                     median {store_ms:.3f} ms"
            f"  ratio {results['turn_store_ratio']}x\n"
            "  daemon's path before: the runtime syncs both lines, then the ending commits\n"
            f"                                     median {before_ms:.3f} ms"
            f"  ratio {results['turn_store_before_ratio']}x"
        )
        print(
            f"raw walk+read+sha256, {args.files} files  {results['raw_walk_ms']:.2f} ms "
            f"({results['raw_walk_files_per_s']} files/s)"
        )
        print(
            f"enumerate_writes,     {args.files} files  {results['enumerate_ms']:.2f} ms "
            f"({results['enumerate_files_per_s']} files/s)"
        )
        print(
            f"  relative throughput {results['enumerate_relative_throughput']:.0%} (target >= 80%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
