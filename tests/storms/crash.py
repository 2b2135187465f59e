"""A crash storm: a real daemon SIGKILLed again and again while clients submit turns.

Used by ``tests/supervisor/test_crash.py`` (a short storm in CI) and ``scripts/crash_storm.py``
(a long one, by hand). `run_storm` does the whole scenario on a fresh root and returns a
`StormReport`; nothing here asserts, the callers judge the report.

The scenario
------------
1. A real ``hunter serve`` on a fresh root (`DemoStack`), a few real chaos executor processes
   that reconnect after a restart: ``ok`` (answers at once), ``slow`` (answers after a short
   delay, so kills find attempts in flight) and ``flaky`` (an ERROR now and then, so kills also
   find turns waiting for a retry). One session.
2. ``submitters`` client tasks submit instruction turns, each with its own
   ``idempotency_key``; about half submit-and-wait (``wait_s``), the others submit, then wait
   separately. A turn counts as acknowledged when a ``turn.submit`` answer names it. When the
   daemon dies under a submit, the client resubmits the same key after the restart.
3. A killer SIGKILLs the daemon ``kills`` times at seeded random points of the turn stream
   (each time once every executor is back and some turns were acknowledged since), and
   restarts it at once.
4. With the daemon up for good: every acknowledged turn is waited for; every key is submitted
   once more (it must name the same turn, ``created`` false); the store's turn count is
   compared with the keys; ``ledger.verify`` runs. Then the daemon is stopped with SIGTERM and
   the session's ledgers are read: each final turn must have exactly one final ``turn`` entry
   in ``exec.jsonl`` and one in ``evidence.jsonl`` (entries of one turn are paired in file
   order; an escalated turn's pair is not final), agreeing with the store's state. Every turn
   the store has (``turns.list``, all sessions) is checked against its session's files too:
   each final turn must have exactly one final ``turn`` entry in its exec ledger and exactly
   one ``turn`` entry for its ending in its evidence ledger (`check_ledger_pairs`), and every
   turn the restarts rolled forward (ended from its ledger entry) must carry an attempt count
   of at least 1 and attempt records that ended: outcome, decision, reason code and finish
   time (`check_rolled_forward`); their number is in the summary. The ledgers are verified
   offline too, and the daemon log must hold no traceback.
5. Mixed load (``mixed``): about ``process_share`` of the turns are sandboxed process turns
   (`PROCESS_TURNS`), so kills also land while sandboxed processes run. The storm's daemon has
   its own sandbox uid range (`storm_uids`); after the final clean stop no process of those
   uids may live, no turn cgroup leaf of the root may be left and every session scratch dir
   (``tmp/<sid>``, ``output/<sid>``) must be empty or gone (`check_leftovers`).

About 700 lines, past the usual 600: the storm's loop (kills, restarts, resubmissions) and
its report share the run's state; the checks it applies live in `crash_checks`.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from ledger import IntegrityError, session_dir_for, verify_session_dir
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning
from tests.storms.crash_checks import (
    LedgerTurnEntries,
    check_daemon_log,
    check_ledger_pairs,
    check_leftovers,
    check_rolled_forward,
    check_turn_entries,
    count_log_events,
    read_turn_entries,
    rolled_forward,
)

__all__ = [
    "CRASH_CONFIG",
    "PROCESS_TURNS",
    "LedgerTurnEntries",
    "StormConfig",
    "StormReport",
    "check_daemon_log",
    "check_ledger_pairs",
    "check_leftovers",
    "check_rolled_forward",
    "check_turn_entries",
    "format_violations",
    "read_turn_entries",
    "rolled_forward",
    "run_storm",
    "storm_config_text",
    "storm_uids",
]

#: The storm's daemon config: the demo's, with a long queue wait (turns wait for the executors
#: to reconnect after each restart) and logging at info (the log is checked for tracebacks).
CRASH_CONFIG: Final = DEMO_CONFIG.replace("queue_wait_s = 3.0", "queue_wait_s = 30.0")

#: Sandbox uids per storm root (one per session: a storm opens one).
_UID_SPAN: Final = 256


def storm_uids(root: Path) -> range:
    """The sandbox uid range of a storm on *root*: its own, picked from the root's path, so
    that the leftover check finds only this storm's processes (other daemons on the machine
    use other ranges)."""
    tag = int.from_bytes(hashlib.sha256(os.fsencode(os.path.realpath(root))).digest()[:4])
    start = 1_700_000_000 + (tag % 100_000) * _UID_SPAN
    return range(start, start + _UID_SPAN)


def storm_config_text(root: Path) -> str:
    """`CRASH_CONFIG` with the root's own sandbox uid range (`storm_uids`)."""
    uids = storm_uids(root)
    return CRASH_CONFIG.replace(
        "[sandbox]\n",
        f"[sandbox]\nuid_range_start = {uids.start}\nuid_range_size = {len(uids)}\n",
    )


#: What a dead or restarting daemon looks like to a control client.
_GONE: Final = (
    ConnectionLost,
    DaemonNotRunning,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StormConfig:
    """How hard the storm blows (defaults: the long run of ``scripts/crash_storm.py``)."""

    kills: int = 20
    turns: int = 3000
    seed: int = 1
    #: concurrent client tasks (each on its own connection)
    submitters: int = 8
    #: executor processes (kinds in turn: ok, slow, flaky)
    executors: int = 3
    slots: int = 4
    #: delay of the ``slow`` executor's answers
    slow_ms: int = 20
    #: share of the ``flaky`` executor's answers that are ERROR
    flaky_probability: float = 0.05
    #: the longest wait for all acknowledged turns to be final once the storm is over
    settle_s: float = 60.0
    #: the longest the whole storm (submits and kills) may take
    storm_limit_s: float = 600.0
    #: mixed load: a share of the turns are sandboxed process turns (see `PROCESS_TURNS`)
    mixed: bool = False
    process_share: float = 0.3

    def __post_init__(self) -> None:
        if (
            self.kills < 0
            or self.turns < 1
            or self.submitters < 1
            or self.executors < 1
            or not 0.0 <= self.process_share <= 1.0
        ):
            msg = f"invalid storm config {self!r}"
            raise ValueError(msg)


@dataclass(slots=True)
class StormReport:
    """What the storm did, and every broken invariant, by kind (each names its turn)."""

    seed: int
    kills: int = 0
    acknowledged: int = 0
    resubmissions: int = 0
    #: resubmissions whose key the daemon had already accepted (answered ``created`` false)
    resubmitted_existing: int = 0
    states: Counter[str] = field(default_factory=Counter)
    ledger_entries: int = 0
    #: turns the restarts ended from their ledger entry (reason ``ROLLED_FORWARD``), and the
    #: daemon log's ``turn_rolled_forward`` events (more when a kill landed in a roll forward)
    rolled_forward: int = 0
    rolled_forward_logged: int = 0
    elapsed_s: float = 0.0
    session_id: str = ""
    #: an acknowledged turn missing from the store or not final
    lost: list[str] = field(default_factory=list)
    #: a key naming two turns, a resubmission naming another turn, turns nobody submitted
    idempotency: list[str] = field(default_factory=list)
    #: more than one final exec or evidence entry for one turn
    ledger_duplicates: list[str] = field(default_factory=list)
    #: a final turn without its pair of entries, an unpaired entry, a status the store denies
    ledger_missing: list[str] = field(default_factory=list)
    #: a final turn of any session (the store's ``turns.list``) without exactly one final
    #: entry in its exec ledger and exactly one entry for its ending in its evidence ledger
    ledger_pairs: list[str] = field(default_factory=list)
    #: a rolled-forward turn with an attempt count of 0 or an attempt record that never ended
    #: (no outcome, decision, reason code or finish time)
    rolled_forward_attempts: list[str] = field(default_factory=list)
    #: ledger verification failures (through the daemon and offline)
    verification: list[str] = field(default_factory=list)
    #: tracebacks and error events in the daemon log
    log: list[str] = field(default_factory=list)
    #: what the last daemon left after its clean stop: processes of the storm's sandbox
    #: uids, turn cgroup leaves of the root, files in the sessions' scratch dirs
    leftovers: list[str] = field(default_factory=list)
    #: turns by kind (instruction, process)
    kinds: Counter[str] = field(default_factory=Counter)
    #: the harness's own findings: the daemon died without a kill, a submit was refused,
    #: an executor did not come back, the final SIGTERM did not exit 0
    storm: list[str] = field(default_factory=list)

    def categories(self) -> dict[str, list[str]]:
        return {
            "lost": self.lost,
            "idempotency": self.idempotency,
            "ledger_duplicates": self.ledger_duplicates,
            "ledger_missing": self.ledger_missing,
            "ledger_pairs": self.ledger_pairs,
            "rolled_forward_attempts": self.rolled_forward_attempts,
            "verification": self.verification,
            "leftovers": self.leftovers,
            "log": self.log,
            "storm": self.storm,
        }

    @property
    def violations(self) -> list[str]:
        return [f"{kind}: {line}" for kind, lines in self.categories().items() for line in lines]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
        kinds = " + ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        verdict = "OK" if self.ok else f"FAILED ({len(self.violations)} violations)"
        return (
            f"crash storm {verdict}: seed {self.seed}, {self.kills} SIGKILLs, "
            f"{self.acknowledged} turns acknowledged ({kinds or 'none'}; {states or 'none'}), "
            f"{self.resubmissions} resubmissions ({self.resubmitted_existing} found the turn "
            f"already accepted), {self.rolled_forward} rolled forward "
            f"({self.rolled_forward_logged} turn_rolled_forward events), "
            f"{self.ledger_entries} ledger entries, {self.elapsed_s:.1f} s"
        )


# --------------------------------------------------------------------------------------------
# The storm


#: The process turns of a mixed storm, in turn: ``(argv, declared output or "")``. Each runs
#: in the sandbox as the session's uid; some last long enough for a kill to find them running,
#: one leaves a background child behind (the sandbox must kill it), one fails, one writes an
#: undeclared scratch file (a violation: writes are enumerated).
PROCESS_TURNS: Final[tuple[tuple[tuple[str, ...], str], ...]] = (
    (("sh", "-c", 'echo "$HUNTER_TURN_NUMBER" > "$HUNTER_OUTPUT_DIR/out.txt"'), "out.txt"),
    (("sh", "-c", "sleep 0.3"), ""),
    (("sh", "-c", 'sleep 300 & echo x > "$HUNTER_OUTPUT_DIR/out.txt"; sleep 0.1'), "out.txt"),
    (("sh", "-c", "sleep 0.05; exit 3"), ""),
    (("sh", "-c", 'echo scratch > "$TMPDIR/s.txt"; sleep 0.1'), ""),
)


@dataclass(frozen=True, slots=True)
class _Key:
    index: int
    key: str
    wait: bool
    process: bool = False


def _executor_argv(kind: str, config: StormConfig, index: int) -> list[str]:
    argv = [
        "supervisor.examples.chaos_executor",
        "--commands",
        "READ",
        "--slots",
        str(config.slots),
    ]
    if kind == "slow":
        return [*argv, "--behaviour", "slow", "--delay-ms", str(config.slow_ms)]
    if kind == "flaky":
        return [
            *argv,
            "--behaviour",
            "error",
            "--probability",
            str(config.flaky_probability),
            "--seed",
            str(config.seed * 1000 + index),
        ]
    return [*argv, "--behaviour", "ok"]


class _Storm:
    def __init__(self, stack: DemoStack, config: StormConfig, show: Callable[[str], None]) -> None:
        self.stack = stack
        self.config = config
        self.show = show
        self.rng = random.Random(config.seed)
        self.report = StormReport(seed=config.seed)
        self.session_id = ""
        self.executor_ids: list[str] = []
        kinds = ("ok", "slow", "flaky")
        self.executor_kinds = {f"{kinds[i % 3]}-{i}": kinds[i % 3] for i in range(config.executors)}
        self.keys = [
            _Key(
                i,
                f"crash-{config.seed}-{i}",
                self.rng.random() < 0.5,
                config.mixed and self.rng.random() < config.process_share,
            )
            for i in range(config.turns)
        ]
        self._next = iter(self.keys)
        #: key -> every turn id a submit answer named for it
        self.acks: dict[str, set[int]] = {}
        self.ack_order: list[tuple[str, int]] = []
        #: set while the daemon is up; replaced by a fresh one before each kill
        self.up = anyio.Event()
        #: bumped before each kill: a client that connected earlier knows its loss is expected
        self.generation = 0
        self.submitting = 0
        #: set while new keys may be submitted (cleared from a kill until the executors are back)
        self.fresh = anyio.Event()
        self.workers_done = anyio.Event()
        self.restart_lock = anyio.Lock()
        #: set once ``len(ack_order)`` reaches ``_target`` (or the clients are done)
        self._target = 0
        self._reached = anyio.Event()
        #: after `settle`: every turn the store has (``turns.list``), every session's directory
        self.stored_turns: list[dict[str, Any]] = []
        self.session_dirs: dict[str, Path] = {}

    # -- clients ------------------------------------------------------------------------------

    def _params(self, key: _Key) -> dict[str, Any]:
        if key.process:
            argv, output = PROCESS_TURNS[key.index % len(PROCESS_TURNS)]
            params: dict[str, Any] = {
                "session_id": self.session_id,
                "kind": "process",
                "argv": list(argv),
                "timeout_ms": 10_000,
                "declared_outputs": [{"path": output, "role": "report"}] if output else [],
                "idempotency_key": key.key,
            }
            if key.wait:
                params["wait_s"] = 60
            return params
        params = {
            "session_id": self.session_id,
            "kind": "instruction",
            "command_type": "READ",
            "target_selector": f"#item-{key.index}",
            "timeout_ms": 5000,
            "declared_outputs": [],
            "idempotency_key": key.key,
        }
        if key.wait:
            params["wait_s"] = 60
        return params

    def _ack(self, key: _Key, result: Mapping[str, Any], *, resubmitted: bool) -> None:
        turn_id = int(result["turn"]["turn_id"])
        seen = self.acks.setdefault(key.key, set())
        if seen and turn_id not in seen:
            self.report.idempotency.append(
                f"key {key.key}: submit answered turn {turn_id}, an earlier answer named "
                f"turn(s) {sorted(seen)}"
            )
        if not seen:
            self.ack_order.append((key.key, turn_id))
            if len(self.ack_order) >= self._target:
                self._reached.set()
        seen.add(turn_id)
        if resubmitted and result.get("created") is False:
            self.report.resubmitted_existing += 1

    async def _restart(self, why: str) -> None:
        """SIGKILL the daemon (unless it is dead already) and start it again. Clients wait for
        the restart; new keys wait until every executor is back too (resubmissions do not), so
        that each kill finds turns flowing and the kills do not outrun the turns."""
        self.up = anyio.Event()
        self.fresh = anyio.Event()
        self.generation += 1
        daemon = self.stack.daemon
        pid = daemon.pid if daemon is not None else "?"
        acked, in_flight = len(self.ack_order), self.submitting
        started = time.monotonic()
        if daemon is not None:
            code = await self.stack.stop_daemon(signal.SIGKILL)
            if code != -signal.SIGKILL:
                self.report.storm.append(f"{why}: the daemon (pid {pid}) had exited {code}")
        await self.stack.start_daemon()
        ready = time.monotonic() - started
        self.up.set()
        await self._executors_back()
        self.fresh.set()
        self.show(
            f"{why}: SIGKILL pid {pid} after {acked} turns acknowledged ({in_flight} submits "
            f"in flight); daemon ready in {ready:.2f} s, executors back in "
            f"{time.monotonic() - started:.2f} s"
        )

    async def _lost_connection(self, generation: int) -> None:
        """After a lost connection: wait for the restart if a kill explains it; if the daemon
        died on its own, note it and restart it (the storm goes on)."""
        if self.generation == generation:
            await anyio.sleep(0.05)
        async with self.restart_lock:
            if self.generation == generation:
                daemon = self.stack.daemon
                code = None if daemon is None else daemon.returncode
                self.report.storm.append(
                    f"a control connection was lost with no kill in progress "
                    f"(daemon exit code {code})"
                )
                if code is not None:
                    await self._restart("unplanned restart (the daemon died on its own)")
        await self.up.wait()

    async def _worker(self) -> None:
        pending: _Key | None = None
        resubmitted = False
        while True:
            await self.up.wait()
            generation = self.generation
            try:
                async with ControlClient(self.stack.control_socket) as client:
                    while True:
                        if pending is None:
                            await self.fresh.wait()
                            pending = next(self._next, None)
                            resubmitted = False
                            if pending is None:
                                return
                        key = pending
                        self.submitting += 1
                        try:
                            result = await client.call("turn.submit", **self._params(key))
                        except ControlClientError as exc:
                            if exc.code == "queue_full":
                                delay = float(exc.details.get("retry_after_ms", 50)) / 1000
                                await anyio.sleep(delay)
                                continue
                            self.report.storm.append(
                                f"key {key.key}: turn.submit refused ({exc.code}: {exc.message})"
                            )
                            pending = None
                            continue
                        finally:
                            self.submitting -= 1
                        self._ack(key, result, resubmitted=resubmitted)
                        pending = None
                        if not key.wait:  # a loss here is no resubmission: the turn is acked
                            turn_id = int(result["turn"]["turn_id"])
                            await client.call("turn.wait", turn_id=turn_id, timeout_s=60)
            except _GONE:
                if pending is not None:
                    self.report.resubmissions += 1
                    resubmitted = True
                await self._lost_connection(generation)

    async def _workers(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self.config.submitters):
                    tg.start_soon(self._worker)
        finally:
            self.workers_done.set()
            self._reached.set()

    # -- the killer -----------------------------------------------------------------------------

    async def _executors_back(self) -> None:
        async with ControlClient(self.stack.control_socket) as client:
            for executor_id in self.executor_ids:
                try:
                    await client.call("executors.wait", executor_id=executor_id, timeout_s=20)
                except ControlClientError as exc:
                    self.report.storm.append(
                        f"executor {executor_id} did not come back after a restart: {exc}"
                    )

    async def _acknowledged(self, target: int) -> None:
        """Wait until *target* turns are acknowledged (or the clients are done)."""
        self._target = target
        self._reached = anyio.Event()
        if len(self.ack_order) >= target or self.workers_done.is_set():
            return
        await self._reached.wait()

    async def _killer(self) -> None:
        # kill n at a random point of the n-th of kills+1 equal stretches of the turn stream,
        # and never before a few turns were acknowledged since the executors came back
        segment = self.config.turns / (self.config.kills + 1)
        for number in range(1, self.config.kills + 1):
            planned = int(segment * (number - 1 + self.rng.uniform(0.5, 1.0)))
            target = max(planned, len(self.ack_order) + max(1, int(segment / 4)))
            await self._acknowledged(target)
            if self.workers_done.is_set():
                self.report.storm.append(
                    f"the turns ran out after {number - 1} of {self.config.kills} kills"
                )
                return
            await anyio.sleep(self.rng.uniform(0.0, 0.03))
            async with self.restart_lock:
                self.report.kills += 1
                await self._restart(f"kill {number}/{self.config.kills}")

    # -- the whole scenario ---------------------------------------------------------------------

    async def setup(self) -> None:
        await self.stack.start_daemon()
        for index, (executor_id, kind) in enumerate(self.executor_kinds.items()):
            await self.stack.start_executor(executor_id, _executor_argv(kind, self.config, index))
            self.executor_ids.append(executor_id)
        async with ControlClient(self.stack.control_socket) as client:
            opened = await client.call("session.open", package_id="demo")
        self.session_id = str(opened["session_id"])
        self.report.session_id = self.session_id
        self.up.set()
        self.fresh.set()

    async def storm(self) -> None:
        with anyio.fail_after(self.config.storm_limit_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._workers)
                tg.start_soon(self._killer)
        self.report.acknowledged = len(self.ack_order)

    async def settle(self) -> dict[int, dict[str, Any]]:
        """Wait for every acknowledged turn to be final; resubmit every key; returns the
        turns by id as the store has them."""
        turns: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.config.settle_s
        lanes = 8

        async def wait_lane(lane: int, client: ControlClient) -> None:
            for key, turn_id in self.ack_order[lane::lanes]:
                try:
                    turn: dict[str, Any] = {}
                    while True:
                        left = deadline - time.monotonic()
                        answer = await client.call(
                            "turn.wait", turn_id=turn_id, timeout_s=max(0.1, min(left, 10))
                        )
                        turn = answer["turn"]
                        if turn["final"] or left <= 0:
                            break
                        if turn["state"] == "escalated":
                            break
                        await anyio.sleep(0.05)
                except ControlClientError as exc:
                    self.report.lost.append(
                        f"turn {turn_id} (key {key}) was acknowledged but the store does not "
                        f"have it: {exc.code}: {exc.message}"
                    )
                    continue
                turns[turn_id] = turn
                if not turn["final"]:
                    self.report.lost.append(
                        f"turn {turn_id} (turn_number {turn['turn_number']}, key {key}) is "
                        f"stuck in state {turn['state']} after {self.config.settle_s:.0f} s"
                    )

        async def resubmit_lane(lane: int, client: ControlClient) -> None:
            for key in self.keys[lane::lanes]:
                seen = self.acks.get(key.key)
                if not seen:
                    continue
                params = self._params(key)
                params.pop("wait_s", None)
                result = await client.call("turn.submit", **params)
                turn_id = int(result["turn"]["turn_id"])
                if result.get("created") is not False or turn_id not in seen:
                    self.report.idempotency.append(
                        f"key {key.key}: a resubmission after the storm answered turn "
                        f"{turn_id} (created={result.get('created')}), the storm's answers "
                        f"named turn(s) {sorted(seen)}"
                    )

        async with ControlClient(self.stack.control_socket) as client:
            async with anyio.create_task_group() as tg:
                for lane in range(lanes):
                    tg.start_soon(wait_lane, lane, client)
            async with anyio.create_task_group() as tg:
                for lane in range(lanes):
                    tg.start_soon(resubmit_lane, lane, client)
            status = await client.call("status")
            stored = sum(int(n) for n in status["turns_by_state"].values())
            if stored != len(self.acks):
                self.report.idempotency.append(
                    f"the store holds {stored} turns for {len(self.acks)} idempotency keys"
                )
            await self._list_stored(client)
            verify = await client.call("ledger.verify", session_id=self.session_id)
            for failure in verify["failures"]:
                self.report.verification.append(
                    f"ledger.verify of session {failure['session_id']}: {failure['error']}"
                )
        for key, seen in self.acks.items():
            if len(seen) != 1:
                self.report.idempotency.append(f"key {key} names turns {sorted(seen)}")
        by_key: dict[str, list[int]] = {}
        for turn_id, turn in turns.items():
            by_key.setdefault(str(turn.get("idempotency_key")), []).append(turn_id)
            if turn.get("session_id") != self.session_id:
                self.report.idempotency.append(f"turn {turn_id} is in another session")
        for key, ids in by_key.items():
            if len(ids) > 1:
                self.report.idempotency.append(f"key {key} names turns {sorted(ids)} in the store")
        for turn in turns.values():
            self.report.states[str(turn["state"])] += 1
        for submitted in self.keys:
            if submitted.key in self.acks:
                self.report.kinds["process" if submitted.process else "instruction"] += 1
        return turns

    async def _list_stored(self, client: ControlClient) -> None:
        """Every turn and session the store has, for the checks over all of them."""
        sessions = await client.call("session.list")
        self.session_dirs = {
            str(s["session_id"]): session_dir_for(
                self.stack.root, str(s["tier"]), str(s["session_id"])
            )
            for s in sessions["sessions"]
        }
        after = 0
        while True:
            page = await client.call("turns.list", after_turn_id=after, limit=500)
            self.stored_turns.extend(page["turns"])
            if page["next_after"] is None:
                return
            after = int(page["next_after"])

    def check_ledgers(self, turns: Mapping[int, Mapping[str, Any]]) -> None:
        session_dir = session_dir_for(self.stack.root, "default", self.session_id)
        problems: list[str] = []
        by_number, count = read_turn_entries(session_dir, problems)
        self.report.ledger_entries = count
        self.report.ledger_missing.extend(problems)
        duplicates, missing = check_turn_entries(turns.values(), by_number)
        self.report.ledger_duplicates.extend(duplicates)
        self.report.ledger_missing.extend(missing)
        self.report.ledger_pairs.extend(check_ledger_pairs(self.stored_turns, self.session_dirs))
        self.report.rolled_forward = len(rolled_forward(self.stored_turns))
        self.report.rolled_forward_attempts.extend(check_rolled_forward(self.stored_turns))
        try:
            verify_session_dir(session_dir)
        except IntegrityError as exc:
            self.report.verification.append(f"offline verification of {session_dir}: {exc}")


async def run_storm(
    root: Path,
    config: StormConfig,
    *,
    show: Callable[[str], None] = lambda line: None,
) -> StormReport:
    """Run the whole crash storm on a fresh *root* (see the module docstring)."""
    started = time.monotonic()
    config_path = prepare_root(root, fresh=True, config_text=storm_config_text(root))
    stack = DemoStack(root=root, config_path=config_path)
    storm = _Storm(stack, config, show)
    report = storm.report
    try:
        await storm.setup()
        show(
            f"crash storm: root {root}, seed {config.seed}, {config.turns} turns, "
            f"{config.kills} kills, {config.submitters} submitters, executors "
            f"{', '.join(storm.executor_ids)}"
        )
        await storm.storm()
        report.acknowledged = len(storm.ack_order)
        show(
            f"storm over: {report.kills} kills, {report.acknowledged} turns acknowledged, "
            f"{report.resubmissions} resubmissions; waiting for every turn to be final"
        )
        turns = await storm.settle()
        for executor_id in list(stack.executors):
            await stack.stop_executor(executor_id)
        code = await stack.stop_daemon(signal.SIGTERM)
        if code != 0:
            report.storm.append(f"the final SIGTERM stop exited {code}, not 0")
        storm.check_ledgers(turns)
        report.leftovers.extend(check_leftovers(root, storm_uids(root)))
    finally:
        await stack.aclose()
        report.log.extend(check_daemon_log(stack.daemon_log))
        report.rolled_forward_logged = count_log_events(stack.daemon_log, "turn_rolled_forward")
        report.elapsed_s = time.monotonic() - started
    return report


def format_violations(report: StormReport, *, limit: int = 50) -> Sequence[str]:
    """The report's violations, at most *limit* per kind (and how many more)."""
    lines: list[str] = []
    for kind, found in report.categories().items():
        for line in found[:limit]:
            lines.append(f"{kind}: {line}")
        if len(found) > limit:
            lines.append(f"{kind}: ... and {len(found) - limit} more")
    return lines
