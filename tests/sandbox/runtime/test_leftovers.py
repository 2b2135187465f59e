"""A runtime reclaims at start what a killed run on its root left, and nothing of anyone else.

Real leftovers: a supervisor process SIGKILLed in the middle of a turn, processes in real
cgroup leaves, processes running as sandbox uids, files in the sandbox dirs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog

from sandbox.confine.cgroups import TurnCgroup, detect_layout, reclaim_cgroups
from sandbox.runtime.runtime import Runtime, RuntimeConfig, cgroup_prefix_for
from sandbox.session_ids import new_session_id

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
_REPO = Path(__file__).resolve().parents[3]
SCRATCH_BYTES = 16 << 20
#: far from the default uid range, so no other runtime on this host uses these uids
UIDS = (3_100_000, 3_100_099)


def dead(pid: int) -> bool:
    """Whether *pid* has exited (gone, or a zombie nobody reaped yet)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def leaves(prefix: str) -> list[Path]:
    """Every cgroup leaf, in every hierarchy, whose name starts with *prefix*."""
    return [
        leaf
        for parent in detect_layout().leaf_parents()
        for leaf in parent.iterdir()
        if leaf.is_dir() and leaf.name.startswith(prefix)
    ]


def reclaimed_events(logs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "sandbox_leftovers_reclaimed"]


def start_in(cg: TurnCgroup | None, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start *argv* and move it into every leaf of *cg* (as the kernel would have it)."""
    proc = subprocess.Popen(argv, cwd="/", **kwargs)
    if cg is not None:
        for leaf in cg.dirs.values():
            (leaf / "cgroup.procs").write_text(str(proc.pid))
    return proc


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def cgroups() -> Iterator[list[TurnCgroup]]:
    """Leaves a test makes itself; killed and removed at the end whatever happened."""
    made: list[TurnCgroup] = []
    yield made
    for cg in made:
        cg.kill_all()
        deadline = time.monotonic() + 5
        while cg.members() and time.monotonic() < deadline:
            time.sleep(0.01)
        cg.remove()


# -- a supervisor killed in the middle of a turn -------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    import structlog
    from sandbox.runtime.runtime import Runtime

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    async def main() -> None:
        runtime = Runtime(sys.argv[1])
        session = runtime.open_session("pkg")
        print(session.session_id, flush=True)
        first = await session.run_process_turn(
            ["/bin/sh", "-c", "echo kept > report.txt"],
            declared_outputs=["report.txt"],
            timeout_ms=10_000,
        )
        assert first.status == "succeeded", first
        await session.run_process_turn(
            ["/bin/sh", "-c", sys.argv[2]], declared_outputs=[], timeout_ms=600_000
        )

    anyio.run(main)
    """
)

_HANGING_TURN = (
    f'head -c {SCRATCH_BYTES} /dev/zero > "$TMPDIR/big"; mkdir "$TMPDIR/sub"; '
    'echo x > "$TMPDIR/sub/f"; setsid sleep 1000 & sleep 1000 & '
    'touch "$HUNTER_OUTPUT_DIR/ready"; wait'
)


@dataclass
class KilledRun:
    """A supervisor SIGKILLed while its second turn ran (the first promoted ``report.txt``)."""

    session_id: str
    pids: list[int]  # what ran in the turn's cgroup when the supervisor died
    ledgers: dict[Path, bytes]  # the files of the ledger dir, as the killed run left them


@pytest.fixture
def killed_run(root: Path, install: Installer, world: Path) -> Iterator[KilledRun]:
    install("pkg")
    script = world / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    child = subprocess.Popen(
        [sys.executable, str(script), str(root), _HANGING_TURN],
        stdout=subprocess.PIPE,
        env=env,
        cwd=_REPO,
    )
    pids: list[int] = []
    try:
        assert child.stdout is not None
        sid = child.stdout.readline().decode().strip()
        ready = root / "output" / sid / "ready"
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert child.poll() is None, "the supervisor process ended early"
            assert time.monotonic() < deadline, "the turn did not start"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        (leaf,) = [
            x for x in leaves(cgroup_prefix_for(root)) if x.parent == detect_layout().unified
        ]
        pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        ledger_dir = next((root / "planes").glob(f"*/sessions/{sid}/ledger"))
        ledgers = {p: p.read_bytes() for p in sorted(ledger_dir.iterdir())}
        assert {p.name for p in ledgers} >= {"exec.jsonl", "evidence.jsonl"}
        yield KilledRun(sid, pids, ledgers)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        # Never leave a `sleep 1000` or a leaf behind, whatever failed: whatever runs in this
        # root's leaves is killed and the leaves removed (a second time, if the test did).
        prefix = cgroup_prefix_for(root)
        reclaim_cgroups(detect_layout(), lambda name: name.startswith(prefix))
        for pid in pids:
            if not dead(pid):
                os.kill(pid, signal.SIGKILL)


def test_killed_runs_cgroups_processes_and_scratch_are_reclaimed_at_start(
    root: Path, killed_run: KilledRun
) -> None:
    """The turn's cgroup (with its processes, one of them setsid), its scratch and its output
    dir are gone once a runtime starts on the root; one event says what was reclaimed."""
    sid = killed_run.session_id
    prefix = cgroup_prefix_for(root)
    alive = [pid for pid in killed_run.pids if not dead(pid)]
    assert len(alive) >= 3  # sh, the setsid sleep, the background sleep: the leftovers are real
    assert leaves(prefix)
    assert (root / "tmp" / sid / "big").stat().st_size == SCRATCH_BYTES

    with structlog.testing.capture_logs() as logs, Runtime(root) as runtime:
        assert all(dead(pid) for pid in killed_run.pids)
        assert leaves(prefix) == []
        assert not (root / "tmp" / sid).exists()
        assert not (root / "output" / sid).exists()
        assert runtime.leftovers is not None

    (event,) = reclaimed_events(logs)
    assert event["log_level"] == "info"
    assert event["root"] == str(root)
    assert event["cgroups"] == 1
    assert len(alive) <= event["processes"] <= len(killed_run.pids)
    assert event["scratch_dirs"] == 2
    assert event["scratch_bytes"] >= SCRATCH_BYTES
    assert event["sessions"] == 1
    assert event["cgroups_busy"] == event["errors"] == []


async def test_resumed_session_keeps_its_ledgers_and_workspace(
    root: Path, killed_run: KilledRun
) -> None:
    """What the reclaim removes is sandbox scratch only: the session's ledgers and workspace
    are byte for byte what the killed run left, and the session resumes and runs turns."""
    sid = killed_run.session_id
    workspace = root / "workspace" / sid
    with Runtime(root) as runtime:
        assert {p: p.read_bytes() for p in killed_run.ledgers} == killed_run.ledgers
        assert (workspace / "report.txt").read_text() == "kept\n"
        with runtime.resume_session(sid) as session:
            assert session.next_turn_number == 2  # the killed turn never got an entry
            assert session.tmp_dir.stat().st_uid == session.uid  # fresh, empty dirs
            assert list(session.tmp_dir.iterdir()) == []
            result = await session.run_process_turn(
                ["/bin/sh", "-c", "echo again > second.txt"],
                declared_outputs=["second.txt"],
                timeout_ms=10_000,
            )
            assert result.status == "succeeded", result.stderr
        for path, before in killed_run.ledgers.items():
            if path.suffix == ".jsonl":  # appended to, never rewritten
                assert path.read_bytes().startswith(before)
    assert (workspace / "report.txt").read_text() == "kept\n"
    assert (workspace / "second.txt").read_text() == "again\n"


# -- processes of sandbox uids -------------------------------------------------------------------


def test_sandbox_uid_processes_outside_any_cgroup_are_killed(root: Path) -> None:
    """A process of a session's uid that no cgroup holds (an escapee of a run without cgroups)
    dies; a sandbox uid owning none of this root's dirs, and a non-sandbox uid, are spared."""
    config = RuntimeConfig(uid_range=UIDS)
    session_uid, idle_uid, foreign_uid = UIDS[0] + 7, UIDS[0] + 8, UIDS[1] + 1
    for uid in (session_uid, foreign_uid):
        area = root / "tmp" / new_session_id()
        area.mkdir(parents=True)
        os.chown(area, uid, uid)
    victim = start_in(None, ["sleep", "1000"], user=session_uid, group=session_uid)
    idle = start_in(None, ["sleep", "1000"], user=idle_uid, group=idle_uid)
    foreign = start_in(None, ["sleep", "1000"], user=foreign_uid, group=foreign_uid)
    try:
        with structlog.testing.capture_logs() as logs, Runtime(root, config=config):
            assert victim.wait(timeout=5) == -signal.SIGKILL
            assert idle.poll() is None
            assert foreign.poll() is None
        (event,) = reclaimed_events(logs)
        assert event["processes"] == 1
        assert event["cgroups"] == 0
        assert event["scratch_dirs"] == 2
        assert list((root / "tmp").iterdir()) == []
    finally:
        stop(victim, idle, foreign)


# -- what is not this root's -----------------------------------------------------------------------


def test_another_roots_leftovers_are_left_to_it(
    root: Path, world: Path, cgroups: list[TurnCgroup]
) -> None:
    """Runtimes of different roots share ``hunter-turns``: a start reclaims only its own
    root's leaves and dirs; the other root's runtime reclaims its own at its start."""
    other = world / "other"
    other.mkdir(mode=0o711)
    sid = new_session_id()
    scratch = other / "tmp" / sid / "keep"
    scratch.parent.mkdir(parents=True)
    scratch.write_bytes(b"x" * 100)
    cg = TurnCgroup.create(
        detect_layout(),
        f"{cgroup_prefix_for(other)}{sid}-a1b2c3",
        memory_bytes=64 << 20,
        pids=16,
    )
    cgroups.append(cg)
    proc = start_in(cg, ["sleep", "1000"])
    try:
        with structlog.testing.capture_logs() as logs, Runtime(root):
            pass
        (event,) = reclaimed_events(logs)
        assert event["log_level"] == "debug"  # nothing of this root was found
        assert (event["cgroups"], event["processes"], event["scratch_dirs"]) == (0, 0, 0)
        assert proc.poll() is None
        assert all(leaf.is_dir() for leaf in cg.dirs.values())
        assert scratch.read_bytes() == b"x" * 100

        with structlog.testing.capture_logs() as logs, Runtime(other):
            assert proc.wait(timeout=5) == -signal.SIGKILL
        (event,) = reclaimed_events(logs)
        assert (event["cgroups"], event["processes"], event["scratch_dirs"]) == (1, 1, 1)
        assert event["scratch_bytes"] == 100
        assert not any(leaf.exists() for leaf in cg.dirs.values())
        assert not scratch.parent.exists()
    finally:
        stop(proc)


def test_leaves_named_before_the_prefix_are_reclaimed_by_session(
    root: Path, cgroups: list[TurnCgroup]
) -> None:
    """A leaf named ``<sid>-<hex>`` (the name before leaves carried the root's prefix) is this
    root's when ``tmp/<sid>`` or ``output/<sid>`` is; one of an unknown session is not."""
    ours, theirs = new_session_id(), new_session_id()
    (root / "output" / ours).mkdir(parents=True)
    layout = detect_layout()
    mine = TurnCgroup.create(layout, f"{ours}-0a0b0c", memory_bytes=64 << 20, pids=16)
    foreign = TurnCgroup.create(layout, f"{theirs}-0a0b0c", memory_bytes=64 << 20, pids=16)
    cgroups += [mine, foreign]
    victim = start_in(mine, ["sleep", "1000"])
    bystander = start_in(foreign, ["sleep", "1000"])
    try:
        with structlog.testing.capture_logs() as logs, Runtime(root):
            assert victim.wait(timeout=5) == -signal.SIGKILL
            assert bystander.poll() is None
        (event,) = reclaimed_events(logs)
        assert (event["cgroups"], event["processes"], event["scratch_dirs"]) == (1, 1, 1)
        assert not any(leaf.exists() for leaf in mine.dirs.values())
        assert all(leaf.is_dir() for leaf in foreign.dirs.values())
    finally:
        stop(victim, bystander)


def test_a_second_runtime_on_a_live_root_reclaims_nothing(root: Path, install: Installer) -> None:
    """While a runtime holds the root (``state/sandbox.lock``), another one on the same root
    (``hunter turn run`` beside the daemon) touches none of its sessions; after it closed,
    the next start reclaims."""
    install("pkg")
    with Runtime(root) as live, live.open_session("pkg") as session:
        planted = session.tmp_dir / "in-use"
        planted.write_text("x")
        with structlog.testing.capture_logs() as logs, Runtime(root) as second:
            assert second.leftovers is None
        assert [e["event"] for e in logs if "leftovers" in e["event"]] == [
            "sandbox_leftovers_not_reclaimed"
        ]
        assert planted.read_text() == "x"
        sid = session.session_id
    assert not (root / "tmp" / sid).exists()  # the session's close removed its dirs
    with Runtime(root) as third:
        assert third.leftovers is not None
        assert not third.leftovers.found


def test_a_leaf_of_this_root_outside_its_cgroup_does_not_shield_a_process(root: Path) -> None:
    """The supervisor restarted in another cgroup cannot find its old leaves; a process of a
    session uid sitting in one (its name carries this root's prefix) is still killed, while
    the same uid in a leaf of another root is spared."""
    config = RuntimeConfig(uid_range=UIDS)
    uid = UIDS[0] + 11
    area = root / "tmp" / new_session_id()
    area.mkdir(parents=True)
    os.chown(area, uid, uid)
    unified = detect_layout().unified
    assert unified is not None
    elsewhere = unified.parent / f"test-elsewhere-{os.getpid()}" / "hunter-turns"
    ours = elsewhere / f"{cgroup_prefix_for(root)}{area.name}-000000"
    theirs = elsewhere / f"{cgroup_prefix_for(root / 'other')}{area.name}-000000"
    ours.mkdir(parents=True)
    theirs.mkdir()
    victim = start_in(None, ["sleep", "1000"], user=uid, group=uid)
    spared = start_in(None, ["sleep", "1000"], user=uid, group=uid)
    try:
        (ours / "cgroup.procs").write_text(str(victim.pid))
        (theirs / "cgroup.procs").write_text(str(spared.pid))
        with structlog.testing.capture_logs() as logs, Runtime(root, config=config):
            assert victim.wait(timeout=5) == -signal.SIGKILL
            assert spared.poll() is None
        (event,) = reclaimed_events(logs)
        assert (event["cgroups"], event["processes"]) == (0, 1)
    finally:
        stop(victim, spared)
        for leaf in (ours, theirs, elsewhere, elsewhere.parent):
            deadline = time.monotonic() + 5
            while leaf.exists():
                try:
                    leaf.rmdir()
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
