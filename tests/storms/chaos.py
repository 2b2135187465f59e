"""Executor chaos: a hundred-plus executors misbehaving at random while real turns run.

Used by ``tests/supervisor/test_chaos_suite.py`` (a bounded run in CI) and
``scripts/chaos_storm.py`` (a long one). `run_chaos` does the whole scenario on a fresh root
and returns a `ChaosReport`; nothing here asserts, the callers judge the report.

The scenario
------------
1. A real ``hunter serve`` (`CHAOS_CONFIG`: short timeouts, a 5 s quarantine), one session, one
   well-behaved executor process for a warm-up of turns; once it has left, the baseline of the
   daemon's RSS, fds and threads (`tests.storms.probe`).
2. The crowd, every executor serving READ: ``executors`` connections in a few
   `tests.storms.chaos_swarm` processes, each with a behaviour drawn at random (hang, slow
   past the deadline, garbage frames, oversized frames, wrong / missing ids, malformed answers,
   errors, partial output, refusals, failures, connections that flap), applied to an
   instruction with probability ``probability`` (``ok`` otherwise); authority claimers in a
   swarm of their own (a claim quarantines the process's uid+pid too); and real processes that
   die: ``crash`` (exit mid-instruction) and ``truncated`` (half a frame, then exit), restarted
   by the harness as soon as they die. Slowloris clients dribble a frame header into both
   sockets one byte at a time, reconnecting whenever the daemon cuts them.
3. For ``seconds``, ``submitters`` clients submit READ instruction turns (and a share of
   sandboxed process turns) and wait for each; a poller calls ``status`` on a new connection
   every ``status_every_s`` with a deadline of ``status_deadline_s``.
4. Judging: every attempt of every turn is checked against the tables of ``docs/protocol.md``
   (what each behaviour's answer is as an outcome) and ``docs/policy.md`` (what each outcome
   decides at each attempt number; a retry the daemon-wide retry budget refused is TERMINATE
   ``DAEMON_RETRY_BUDGET_EXHAUSTED``), and the turn's final state against its last decision
   (`expected_attempt`, `expected_state`). Then the crowd leaves, and the daemon's fds and RSS
   must come back near the baseline (``fd_slack``, ``rss_slack_mb``). The RSS slack covers what
   the daemon keeps on purpose: its bounded cache of the last 4,096 finished turns
   (`supervisor.turns.tracker`) fills during the run, about 25 MB when full (`scripts/soak.py`
   shows RSS flat once it is). The daemon must still be
   the process started in step 1, stop with exit 0 on SIGTERM, and its ledgers must verify.

About 660 lines, past the usual 600: the scenario (executor swarm, workload, status polling)
and its report are one run whose parts share the run's state; the long and the bounded
versions call it alike.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import struct
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from supervisor.errors import ConnectionLost, ControlClientError, DaemonNotRunning
from tests.storms.crash_checks import ANYIO_READ_RACE, check_daemon_log, count_log_events
from tests.storms.probe import ProcessSample, sample_process

__all__ = [
    "CHAOS_CONFIG",
    "SWARM_MIX",
    "ChaosConfig",
    "ChaosReport",
    "expected_attempt",
    "expected_state",
    "format_violations",
    "judge_turn",
    "run_chaos",
]

#: The chaos daemon's config: the demo's, with a short quarantine (authority claimers come
#: back during the run) and logging at warning (a hundred executors connecting is not news).
#: the repository root (the swarm processes import ``tests.storms``)
_REPO: Final = Path(__file__).resolve().parents[2]

CHAOS_CONFIG: Final = (
    DEMO_CONFIG.replace("quarantine_s = 60.0", "quarantine_s = 5.0")
    .replace("queue_wait_s = 3.0", "queue_wait_s = 1.0")
    .replace('level = "info"', 'level = "warning"')
)
MAX_ATTEMPTS: Final = 3  # [retry] max_attempts of DEMO_CONFIG

#: Behaviours of the swarm executors, drawn at random (``authority`` lives in its own swarm).
SWARM_MIX: Final = (
    "ok",
    "hang",
    "slow",
    "garbage",
    "oversized",
    "wrong-id",
    "missing-id",
    "malformed",
    "unknown-type",
    "no-evidence",
    "error",
    "partial",
    "refuse",
    "failure",
    "flap",
)

# What an executor's answer is as an outcome (docs/protocol.md 3.5 and 7): (outcome, fault).
_SUCCESS: Final = ("SUCCESS", None)
_CRASH: Final = ("FAULT", "CRASH")
_TIMEOUT: Final = ("FAULT", "TIMEOUT")
_INVALID: Final = ("FAULT", "INVALID_RESPONSE")
_OUTCOMES: Final[Mapping[str, tuple[str, str | None]]] = {
    "ok": _SUCCESS,
    "hang": _TIMEOUT,  # no answer by the deadline (then TIMEOUT to the cancel, dropped)
    "slow": _TIMEOUT,  # answers after the deadline (a late response, dropped)
    "garbage": _INVALID,  # FRAME_ERROR (FrameDecodeError), connection closed
    "oversized": _INVALID,  # FRAME_ERROR (FrameTooLarge), connection closed
    "wrong-id": _INVALID,  # the one instruction in flight: judged as its answer
    "missing-id": _INVALID,
    "malformed": _INVALID,
    "unknown-type": _INVALID,
    "no-evidence": _INVALID,
    "error": _CRASH,  # ERROR -> CRASH
    "partial": ("FAULT", "PARTIAL"),
    "refuse": ("REFUSED", None),
    "failure": ("FAILURE", None),
    "authority": ("FAULT", "SECURITY_VIOLATION"),
    "flap": _CRASH,  # the connection dropped with the instruction in flight
    "crash": _CRASH,  # EOF between frames: EXECUTOR_DISCONNECTED
    "truncated": _CRASH,  # EOF in the middle of a frame: EXECUTOR_DISCONNECTED
}
# What each outcome decides (docs/policy.md: the decide_attempt and Phase-21 tables), no phase.
_TERMINAL: Final[Mapping[tuple[str, str | None], str]] = {
    _SUCCESS: "ATTEMPT_SUCCEEDED",
    _INVALID: "INVALID_RESPONSE_NOT_RETRYABLE",
    ("FAULT", "PARTIAL"): "PARTIAL_NOT_RETRYABLE",
    ("FAULT", "SECURITY_VIOLATION"): "SECURITY_VIOLATION_TERMINATE",
    ("REFUSED", None): "EXECUTOR_REFUSED",
    ("FAILURE", None): "FAILURE_NOT_RETRIED",
    ("NO_EXECUTOR", None): "NO_CAPABLE_EXECUTOR",
}
_RETRYABLE: Final[Mapping[tuple[str, str | None], tuple[str, str]]] = {
    _CRASH: ("RETRY_AFTER_CRASH", "CRASH_RETRY_LIMIT_REACHED"),
    _TIMEOUT: ("RETRY_AFTER_TIMEOUT", "TIMEOUT_RETRY_LIMIT_REACHED"),
}
_BUDGET_REFUSED: Final = "DAEMON_RETRY_BUDGET_EXHAUSTED"


def behaviour_of(executor_id: str | None) -> str | None:
    """The behaviour an executor id of this suite names (``<behaviour>-<n>``), or None."""
    if not executor_id:
        return None
    return executor_id.rsplit("-", 1)[0]


def expected_attempt(
    behaviour: str | None, attempt_number: int, *, max_attempts: int = MAX_ATTEMPTS
) -> set[tuple[str, str | None, str, str]]:
    """Every ``(outcome, fault_type, decision, reason_code)`` the tables allow for an attempt
    that reached an executor of *behaviour* (None: reached none). A behaviour is applied with
    some probability, so ``ok``'s outcome is always allowed too."""
    if behaviour is None:
        # no free slot within the wait (QUEUE_WAIT_EXPIRED: TIMEOUT) or no executor at all
        outcomes = {_TIMEOUT, ("NO_EXECUTOR", None)}
    else:
        outcomes = {_SUCCESS, _OUTCOMES[behaviour]}
    allowed: set[tuple[str, str | None, str, str]] = set()
    for outcome in outcomes:
        if outcome in _RETRYABLE:
            retry, limit = _RETRYABLE[outcome]
            if attempt_number < max_attempts:
                allowed.add((*outcome, "RETRY", retry))
                allowed.add((*outcome, "TERMINATE", _BUDGET_REFUSED))
            else:
                allowed.add((*outcome, "TERMINATE", limit))
        else:
            decision = "SUCCEED" if outcome == _SUCCESS else "TERMINATE"
            allowed.add((*outcome, decision, _TERMINAL[outcome]))
    return allowed


def expected_state(outcome: str, fault_type: str | None, decision: str) -> str:
    """The final state a turn's last decision gives it (docs/policy.md, docs/turns.md)."""
    if decision == "SUCCEED":
        return "succeeded"
    if fault_type == "TIMEOUT":
        return "timeout"
    if fault_type == "SECURITY_VIOLATION":
        return "violation"
    if outcome == "FAILURE":
        return "failed"
    return "terminated"


#: Process turns beside the instruction turns: (argv, state, reason code of the decision).
PROCESS_TURNS: Final = (
    (("true",), "succeeded", "ATTEMPT_SUCCEEDED"),
    (("sh", "-c", "exit 3"), "failed", "FAILURE_NOT_RETRIED"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    """How wild the crowd is (defaults: the long run of ``scripts/chaos_storm.py``)."""

    seed: int = 1
    #: swarm executor connections (plus ``authority`` claimers and the dying processes)
    executors: int = 120
    swarms: int = 4
    authority: int = 6
    #: real processes: half ``crash``, half ``truncated``, restarted when they die
    dying: int = 4
    #: share of instructions a misbehaving executor misbehaves on
    probability: float = 0.5
    seconds: float = 300.0
    submitters: int = 24
    timeout_ms: int = 1000
    process_share: float = 0.1
    #: slowloris connections per socket (executors and control)
    slowloris: int = 8
    status_every_s: float = 0.25
    status_deadline_s: float = 5.0
    #: how far fds and RSS may stay above the baseline once the crowd has left
    fd_slack: int = 8
    rss_slack_mb: float = 48.0
    warmup_turns: int = 100

    def __post_init__(self) -> None:
        if self.executors < 1 or self.swarms < 1 or self.seconds <= 0 or self.submitters < 1:
            msg = f"invalid chaos config {self!r}"
            raise ValueError(msg)


@dataclass(slots=True)
class ChaosReport:
    """What the chaos run did and every broken expectation, by kind."""

    seed: int
    executors: int = 0
    #: executors the daemon knew when the turns started
    registered: int = 0
    behaviours: Counter[str] = field(default_factory=Counter)
    turns: int = 0
    states: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    deaths: int = 0
    slowloris_cut: Counter[str] = field(default_factory=Counter)
    status_calls: int = 0
    status_max_s: float = 0.0
    baseline: ProcessSample | None = None
    peak: ProcessSample | None = None
    after: ProcessSample | None = None
    elapsed_s: float = 0.0
    #: asyncio error lines of the known anyio race (`ANYIO_READ_RACE`), tolerated and counted
    anyio_read_races: int = 0
    #: an attempt or final state the tables do not allow
    decisions: list[str] = field(default_factory=list)
    #: status did not answer within its deadline
    status: list[str] = field(default_factory=list)
    #: fds or RSS not back near the baseline
    resources: list[str] = field(default_factory=list)
    #: the daemon died, did not stop cleanly, its ledgers do not verify, tracebacks in its log
    daemon: list[str] = field(default_factory=list)

    def categories(self) -> dict[str, list[str]]:
        return {
            "decisions": self.decisions,
            "status": self.status,
            "resources": self.resources,
            "daemon": self.daemon,
        }

    @property
    def violations(self) -> list[str]:
        return [f"{kind}: {line}" for kind, lines in self.categories().items() for line in lines]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"FAILED ({len(self.violations)} violations)"
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
        faults = ", ".join(f"{n} {s}" for s, n in self.attempts.most_common())

        def mem(s: ProcessSample | None) -> str:
            return "?" if s is None else f"{s.rss_mb:.0f} MB/{s.fds} fds"

        cuts = ", ".join(f"{n} on {s}" for s, n in sorted(self.slowloris_cut.items()))
        return (
            f"executor chaos {verdict}: seed {self.seed}, {self.executors} executors "
            f"({self.registered} registered at the start), "
            f"{self.turns} turns ({states or 'none'}), attempts {faults or 'none'}, "
            f"{self.deaths} executor deaths, slowloris cut {cuts or 'never'}, "
            f"{self.status_calls} status calls (slowest {self.status_max_s:.2f} s), daemon "
            f"{mem(self.baseline)} -> peak {mem(self.peak)} -> after {mem(self.after)}, "
            f"{self.anyio_read_races} anyio read-race log lines, {self.elapsed_s:.0f} s"
        )


def judge_turn(turn: Mapping[str, Any], report: ChaosReport) -> None:
    """Check one final turn (a ``turn.get`` dict) against the tables; add what is wrong to
    *report* (and count its states and attempt outcomes)."""
    name = f"turn {turn['turn_id']} ({turn.get('kind')}, state {turn['state']})"
    report.turns += 1
    report.states[str(turn["state"])] += 1
    attempts: Sequence[Mapping[str, Any]] = turn.get("attempts") or []
    if not turn.get("final"):
        report.decisions.append(f"{name} is not final after the run")
        return
    if not attempts:
        report.decisions.append(f"{name} has no attempts")
        return
    last: tuple[str, str | None, str] = ("", None, "")
    for index, attempt in enumerate(attempts, start=1):
        got = (
            str(attempt.get("outcome")),
            attempt.get("fault_type"),
            str(attempt.get("decision")),
            str(attempt.get("reason_code")),
        )
        report.attempts[got[1] or got[0]] += 1
        allowed: set[tuple[str, str | None, str, str]]
        if turn.get("kind") == "process":
            argv = tuple((turn.get("spec") or {}).get("argv") or ())
            allowed = {
                (("SUCCESS", None, "SUCCEED", code) if state == "succeeded" else
                 ("FAILURE", None, "TERMINATE", code))
                for a, state, code in PROCESS_TURNS if a == argv
            }  # fmt: skip
        else:
            allowed = expected_attempt(behaviour_of(attempt.get("executor_id")), index)
        if got not in allowed:
            report.decisions.append(
                f"{name}: attempt {index} on {attempt.get('executor_id')} was {got}, the "
                f"tables allow {sorted(allowed, key=str)}"
            )
        if got[2] == "RETRY" and index == len(attempts):
            report.decisions.append(f"{name}: its last attempt says RETRY")
        if got[2] != "RETRY" and index < len(attempts):
            report.decisions.append(f"{name}: attempt {index} ({got}) was not last")
        last = (got[0], got[1], got[2])
    state = expected_state(*last)
    if state != turn["state"]:
        report.decisions.append(
            f"{name}: its last decision {last} gives state {state}, not {turn['state']}"
        )


def _swarm_ids(config: ChaosConfig, rng: random.Random) -> list[list[tuple[str, str]]]:
    swarms: list[list[tuple[str, str]]] = [[] for _ in range(config.swarms)]
    for n in range(config.executors):
        behaviour = rng.choice(SWARM_MIX)
        swarms[n % config.swarms].append((f"{behaviour}-{n}", behaviour))
    return swarms


class _Chaos:
    def __init__(self, stack: DemoStack, config: ChaosConfig, show: Callable[[str], None]):
        self.stack = stack
        self.config = config
        self.show = show
        self.rng = random.Random(config.seed)
        self.report = ChaosReport(seed=config.seed)
        self.session_id = ""
        self.turn_ids: list[int] = []
        self.stop = anyio.Event()
        self.done = anyio.Event()
        self.count = 0
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        daemon = self.stack.daemon
        assert daemon is not None
        return daemon.pid

    def _params(self, n: int) -> dict[str, Any]:
        if self.rng.random() < self.config.process_share:
            argv, _state, _code = PROCESS_TURNS[n % len(PROCESS_TURNS)]
            return {
                "session_id": self.session_id,
                "kind": "process",
                "argv": list(argv),
                "declared_outputs": [],
                "idempotency_key": f"chaos-{self.config.seed}-{n}",
                "wait_s": 60,
            }
        return {
            "session_id": self.session_id,
            "kind": "instruction",
            "command_type": "READ",
            "target_selector": f"#item-{n}",
            "timeout_ms": self.config.timeout_ms,
            "declared_outputs": [],
            "idempotency_key": f"chaos-{self.config.seed}-{n}",
            "wait_s": 60,
        }

    async def _submitter(self) -> None:
        async with ControlClient(self.stack.control_socket) as client:
            while not self.stop.is_set():
                n = self.count
                self.count += 1
                try:
                    result = await client.call("turn.submit", **self._params(n))
                except ControlClientError as exc:
                    if exc.code == "queue_full":  # admission control: back off as told
                        await anyio.sleep(float(exc.details.get("retry_after_ms", 50)) / 1000)
                        continue
                    self.report.daemon.append(f"turn.submit refused: {exc.code}: {exc.message}")
                    continue
                self.turn_ids.append(int(result["turn"]["turn_id"]))

    async def _status_poller(self) -> None:
        every = self.config.status_every_s
        deadline = self.config.status_deadline_s
        while not self.done.is_set():
            started = time.monotonic()
            try:
                with anyio.fail_after(deadline):
                    async with ControlClient(self.stack.control_socket) as client:
                        await client.call("status")
            except TimeoutError:
                self.report.status.append(
                    f"status did not answer within {deadline:.0f} s at "
                    f"{started - self.started:.1f} s"
                )
            except (OSError, ConnectionLost, DaemonNotRunning, ControlClientError) as exc:
                self.report.status.append(
                    f"status failed at {started - self.started:.1f} s: {exc!r}"
                )
                daemon = self.stack.daemon
                if daemon is None or daemon.returncode is not None:
                    return  # the daemon died: run() reports it
            else:
                took = time.monotonic() - started
                self.report.status_calls += 1
                self.report.status_max_s = max(self.report.status_max_s, took)
                try:
                    sample = sample_process(self.pid)
                except ProcessLookupError:
                    return
                peak = self.report.peak
                if peak is None or sample.rss_bytes > peak.rss_bytes or sample.fds > peak.fds:
                    self.report.peak = ProcessSample(
                        rss_bytes=max(sample.rss_bytes, peak.rss_bytes if peak else 0),
                        fds=max(sample.fds, peak.fds if peak else 0),
                        threads=max(sample.threads, peak.threads if peak else 0),
                    )
            with anyio.move_on_after(every):
                await self.done.wait()

    async def _slowloris(self, path: Path, name: str) -> None:
        """Dribble a frame header (announcing a small body) one byte every 0.3 s; count each
        time the daemon cuts the connection, and come back."""
        header = struct.pack(">I", 64) + b'{"type": "hello", '
        while not self.stop.is_set():
            try:
                async with await anyio.connect_unix(path) as stream:
                    for byte in header:
                        await stream.send(bytes([byte]))
                        with anyio.move_on_after(0.3):
                            await self.stop.wait()
                        if self.stop.is_set():
                            return
                    await self.stop.wait()  # the frame never completes
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.report.slowloris_cut[name] += 1
                with anyio.move_on_after(0.1):
                    await self.stop.wait()

    async def _dying(self, index: int) -> None:
        """A real executor process that dies on some instructions; restarted when it does."""
        behaviour = "crash" if index % 2 == 0 else "truncated"
        executor_id = f"{behaviour}-d{index}"
        generation = 0
        while not self.stop.is_set():
            argv = [
                "supervisor.examples.chaos_executor",
                "--commands",
                "READ",
                "--behaviour",
                behaviour,
                "--probability",
                str(self.config.probability),
                "--seed",
                str(self.config.seed * 1000 + index * 100 + generation),
            ]
            proc = await self.stack.start_executor(executor_id, argv, wait_ready=False)
            generation += 1
            async with anyio.create_task_group() as tg:

                async def stopper(proc: anyio.abc.Process = proc) -> None:
                    await self.stop.wait()
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()

                tg.start_soon(stopper)
                await proc.wait()
                tg.cancel_scope.cancel()
            if not self.stop.is_set():
                self.report.deaths += 1
            self.stack.executors.pop(executor_id, None)
            await proc.aclose()

    async def setup(self) -> None:
        await self.stack.start_daemon()
        await self.stack.start_executor(
            "ok-anchor",
            ["supervisor.examples.chaos_executor", "--commands", "READ", "--slots", "4"],
        )
        async with ControlClient(self.stack.control_socket) as client:
            opened = await client.call("session.open", package_id="demo")
            self.session_id = str(opened["session_id"])

            async def warm(n: int) -> None:
                params = {**self._params(n), "idempotency_key": f"warmup-{n}"}
                await client.call("turn.submit", **params)

            async with anyio.create_task_group() as tg:
                for n in range(self.config.warmup_turns):
                    tg.start_soon(warm, n)
        # the crowd alone serves READ from now on
        await self.stack.stop_executor("ok-anchor")
        await anyio.sleep(1.0)
        self.report.baseline = sample_process(self.pid)

    async def crowd(self, tg: anyio.abc.TaskGroup) -> None:
        # The dying processes register first: an attempt goes to the least-loaded executor,
        # ties to the first registered, so the first ones get the most work.
        for index in range(self.config.dying):
            tg.start_soon(self._dying, index)
        async with ControlClient(self.stack.control_socket) as client:
            for index in range(self.config.dying):
                behaviour = "crash" if index % 2 == 0 else "truncated"
                with contextlib.suppress(ControlClientError):
                    await client.call(
                        "executors.wait", executor_id=f"{behaviour}-d{index}", timeout_s=10
                    )
        self.report.behaviours["crash"] += (self.config.dying + 1) // 2
        self.report.behaviours["truncated"] += self.config.dying // 2
        swarms = _swarm_ids(self.config, self.rng)
        authority = [(f"authority-{n}", "authority") for n in range(self.config.authority)]
        for number, pairs in enumerate([authority, *swarms]):
            if not pairs:
                continue
            self.report.behaviours.update(b for _id, b in pairs)
            argv = [
                "tests.storms.chaos_swarm",
                "--executors",
                ",".join(f"{i}={b}" for i, b in pairs),
                "--probability",
                str(self.config.probability),
                "--seed",
                str(self.config.seed * 100 + number),
                "--delay-ms",
                str(self.config.timeout_ms * 2),
                "--slots",
                "1",
            ]
            await self.stack.start_executor(f"swarm-{number}", argv, wait_ready=False)
        self.report.executors = sum(self.report.behaviours.values())
        for _ in range(self.config.slowloris):
            tg.start_soon(self._slowloris, self.stack.executor_socket, "executors.sock")
            tg.start_soon(self._slowloris, self.stack.control_socket, "control.sock")
        # the storm starts once nine in ten have registered (at most 30 s)
        wanted = self.report.executors * 9 // 10
        async with ControlClient(self.stack.control_socket) as client:
            with anyio.move_on_after(30):
                while True:
                    status = await client.call("status")
                    self.report.registered = int(status["executors_total"])
                    if self.report.registered >= wanted:
                        break
                    await anyio.sleep(0.2)
        for _ in range(self.config.slowloris):
            tg.start_soon(self._slowloris, self.stack.executor_socket, "executors.sock")
            tg.start_soon(self._slowloris, self.stack.control_socket, "control.sock")

    async def judge(self) -> None:
        async with ControlClient(self.stack.control_socket) as client:
            for turn_id in self.turn_ids:
                answer = await client.call("turn.wait", turn_id=turn_id, timeout_s=30)
                judge_turn(answer["turn"], self.report)

    async def leave(self) -> None:
        """Stop the crowd, then wait (at most 20 s) for the daemon's fds to come back."""
        for executor_id in list(self.stack.executors):
            await self.stack.stop_executor(executor_id)
        baseline = self.report.baseline
        assert baseline is not None
        after = sample_process(self.pid)
        with anyio.move_on_after(20):
            while after.fds > baseline.fds + self.config.fd_slack:
                await anyio.sleep(0.25)
                after = sample_process(self.pid)
        await anyio.sleep(1.0)
        self.report.after = after = sample_process(self.pid)
        if after.fds > baseline.fds + self.config.fd_slack:
            self.report.resources.append(
                f"the daemon holds {after.fds} fds once the crowd left, baseline {baseline.fds} "
                f"(slack {self.config.fd_slack})"
            )
        if after.rss_mb > baseline.rss_mb + self.config.rss_slack_mb:
            self.report.resources.append(
                f"the daemon's RSS is {after.rss_mb:.1f} MB once the crowd left, baseline "
                f"{baseline.rss_mb:.1f} MB (slack {self.config.rss_slack_mb:.0f} MB)"
            )

    async def run(self) -> None:
        self.started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._status_poller)
            async with anyio.create_task_group() as storm:
                await self.crowd(storm)
                async with anyio.create_task_group() as clients:
                    for _ in range(self.config.submitters):
                        clients.start_soon(self._submitter)
                    await anyio.sleep(self.config.seconds)
                    self.stop.set()
            self.show(f"storm over: {len(self.turn_ids)} turns submitted; judging")
            await self.judge()
            await self.leave()
            self.done.set()
        daemon = self.stack.daemon
        if daemon is None or daemon.returncode is not None:
            self.report.daemon.append("the daemon died during the run")
            return
        async with ControlClient(self.stack.control_socket) as client:
            verify = await client.call("ledger.verify", session_id=self.session_id)
        for failure in verify["failures"]:
            self.report.daemon.append(f"ledger.verify: {failure}")


async def run_chaos(
    root: Path, config: ChaosConfig, *, show: Callable[[str], None] = lambda line: None
) -> ChaosReport:
    """Run the whole executor chaos scenario on a fresh *root* (see the module docstring)."""
    started = time.monotonic()
    config_path = prepare_root(root, fresh=True, config_text=CHAOS_CONFIG)
    # the swarm runs as ``python -m tests.storms.chaos_swarm``: the repository on its path
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    stack = DemoStack(root=root, config_path=config_path, env={"PYTHONPATH": path})
    chaos = _Chaos(stack, config, show)
    report = chaos.report
    try:
        await chaos.setup()
        show(f"executor chaos: root {root}, seed {config.seed}, baseline {report.baseline}")
        await chaos.run()
        for executor_id in list(stack.executors):
            await stack.stop_executor(executor_id)
        if stack.daemon is not None:
            code = await stack.stop_daemon(signal.SIGTERM)
            if code != 0:
                report.daemon.append(f"the final SIGTERM stop exited {code}, not 0")
    finally:
        await stack.aclose()
        report.daemon.extend(check_daemon_log(stack.daemon_log, tolerated=[ANYIO_READ_RACE]))
        report.anyio_read_races = count_log_events(stack.daemon_log, ANYIO_READ_RACE)
        report.elapsed_s = time.monotonic() - started
    return report


def format_violations(report: ChaosReport, *, limit: int = 30) -> Sequence[str]:
    """The report's violations, at most *limit* per kind (and how many more)."""
    lines: list[str] = []
    for kind, found in report.categories().items():
        lines.extend(f"{kind}: {line}" for line in found[:limit])
        if len(found) > limit:
            lines.append(f"{kind}: ... and {len(found) - limit} more")
    return lines
