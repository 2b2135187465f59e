"""A soak: a real daemon under a steady mixed workload, sampled every second, judged on trends.

Used by ``scripts/soak.py`` (10 minutes by default) and ``tests/supervisor/test_soak.py`` (60 s
in CI). `run_soak` does the whole run on a fresh root and returns a `SoakReport`; nothing here
asserts, the callers judge the report (`SoakReport.problems`).

The run
-------
1. A real ``hunter serve`` (the demo config, logging at warning), one session, two well-behaved
   executor processes and one that answers ERROR on 5% of instructions (so retries happen).
   A warm-up of ``warmup_turns`` instruction turns fills the daemon's bounded caches (it keeps
   the last 4,096 finished turns in memory) before sampling starts.
2. ``clients`` clients submit turns at ``rate`` turns per second in all, each turn
   submit-and-wait: instruction turns (READ) and, ``process_share`` of them, sandboxed process
   turns (one writes a declared output, one exits 3). Each turn's round trip is its latency.
3. Every second: the daemon's RSS, fds and threads (`tests.storms.probe`), and the median
   latency of the turns that finished in that second.
4. Judging: over the second half of the run (the first half is warm-up: caches, the store, the
   allocator settle), the least-squares slope of each series must stay within its bound
   (`Bounds`, per minute; a slope whose growth across the half stays under a small floor,
   three threads, four fds, two MB or a doubling of the latency, is noise, not a trend);
   every turn must have finished; the daemon must stop with exit 0 on SIGTERM, its ledgers
   must verify and its log must hold no traceback.
"""

from __future__ import annotations

import contextlib
import random
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from tests.storms.crash_checks import ANYIO_READ_RACE, check_daemon_log, count_log_events
from tests.storms.probe import sample_process, slope

__all__ = [
    "SOAK_CONFIG",
    "Bounds",
    "SoakConfig",
    "SoakReport",
    "SoakSample",
    "format_samples",
    "judge_trends",
    "run_soak",
]

SOAK_CONFIG: Final = DEMO_CONFIG.replace('level = "info"', 'level = "warning"')


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """The largest growth per minute allowed over the second half (least-squares slopes).

    Generous on purpose: a 2-core VM shared with other work wobbles; a leak of one object per
    turn at 20 turns/s grows far faster than these (about 1,200 fds or several MB per minute).
    """

    rss_mb_per_min: float = 4.0
    fds_per_min: float = 6.0
    threads_per_min: float = 3.0
    #: latency may grow by this share of the second half's median latency per minute
    latency_share_per_min: float = 0.5
    #: ... and a slope is a trend only when the growth it implies across the second half is
    #: above this floor too: in a 60 s run one more worker thread (6 -> 7) half-way is a
    #: slope of about 2 per minute, but 1 thread, not a leak
    rss_mb_floor: float = 2.0
    fds_floor: float = 4.0
    threads_floor: float = 3.0
    #: latency: the larger of this and the second half's median latency (a doubling)
    latency_floor_ms: float = 50.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig:
    """How long and how hard (defaults: the 10-minute run of ``scripts/soak.py``)."""

    seconds: float = 600.0
    rate: float = 20.0
    clients: int = 4
    process_share: float = 0.2
    seed: int = 1
    #: instruction turns run before sampling starts: more than the daemon keeps in its bounded
    #: cache of recently finished turns (4,096, `supervisor.turns.tracker`), so that filling
    #: it is not mistaken for a leak
    warmup_turns: int = 5000
    bounds: Bounds = field(default_factory=Bounds)

    def __post_init__(self) -> None:
        if self.seconds < 4 or self.rate <= 0 or self.clients < 1:
            msg = f"invalid soak config {self!r}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class SoakSample:
    """One second of the run."""

    t: float
    rss_mb: float
    fds: int
    threads: int
    #: median latency of the turns finished in this second (None: none finished)
    latency_ms: float | None


@dataclass(slots=True)
class SoakReport:
    """The samples, the slopes over the second half and every problem found."""

    seed: int
    samples: list[SoakSample] = field(default_factory=list)
    turns: int = 0
    states: Counter[str] = field(default_factory=Counter)
    slopes: dict[str, float] = field(default_factory=dict)
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    elapsed_s: float = 0.0
    #: asyncio error lines of the known anyio race (`ANYIO_READ_RACE`), tolerated and counted
    anyio_read_races: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"FAILED ({len(self.problems)} problems)"
        first = self.samples[0] if self.samples else None
        last = self.samples[-1] if self.samples else None
        span = (
            f"RSS {first.rss_mb:.0f} -> {last.rss_mb:.0f} MB, fds {first.fds} -> {last.fds}, "
            f"threads {first.threads} -> {last.threads}"
            if first and last
            else "no samples"
        )
        slopes = ", ".join(f"{k} {v:+.2f}" for k, v in self.slopes.items())
        return (
            f"soak {verdict}: {self.elapsed_s:.0f} s, {self.turns} turns, {len(self.samples)} "
            f"samples, {span}; latency p50 {self.latency_p50_ms:.0f} ms, p99 "
            f"{self.latency_p99_ms:.0f} ms; second-half slopes per minute: {slopes or 'none'}; "
            f"{self.anyio_read_races} anyio read-race log lines"
        )


_PROCESS_TURNS: Final = (
    (("sh", "-c", 'echo soak > "$HUNTER_OUTPUT_DIR/out.txt"'), "out.txt"),
    (("sh", "-c", "exit 3"), ""),
)


class _Soak:
    def __init__(self, stack: DemoStack, config: SoakConfig, show: Callable[[str], None]):
        self.stack = stack
        self.config = config
        self.show = show
        self.rng = random.Random(config.seed)
        self.report = SoakReport(seed=config.seed)
        self.session_id = ""
        self.count = 0
        #: (finished at, latency ms) of every turn
        self.latencies: list[tuple[float, float]] = []
        self.started = time.monotonic()

    def _params(self, n: int) -> dict[str, Any]:
        key = f"soak-{self.config.seed}-{n}"
        if self.rng.random() < self.config.process_share:
            argv, output = _PROCESS_TURNS[n % len(_PROCESS_TURNS)]
            return {
                "session_id": self.session_id,
                "kind": "process",
                "argv": list(argv),
                "declared_outputs": [{"path": output, "role": "report"}] if output else [],
                "idempotency_key": key,
                "wait_s": 60,
            }
        return {
            "session_id": self.session_id,
            "kind": "instruction",
            "command_type": "READ",
            "target_selector": f"#item-{n}",
            "timeout_ms": 5000,
            "declared_outputs": [],
            "idempotency_key": key,
            "wait_s": 60,
        }

    async def _client(self, end: float) -> None:
        period = self.config.clients / self.config.rate
        async with ControlClient(self.stack.control_socket) as client:
            next_at = time.monotonic()
            while next_at < end:
                n = self.count
                self.count += 1
                sent = time.monotonic()
                result = await client.call("turn.submit", **self._params(n))
                done = time.monotonic()
                turn = result["turn"]
                if not turn["final"]:
                    turn = (await client.call("turn.wait", turn_id=turn["turn_id"]))["turn"]
                    done = time.monotonic()
                if not turn["final"]:
                    self.report.problems.append(f"turn {turn['turn_id']} did not finish")
                self.report.turns += 1
                self.report.states[str(turn["state"])] += 1
                self.latencies.append((done, (done - sent) * 1000))
                next_at = max(next_at + period, done - 1.0)
                await anyio.sleep(max(0.0, next_at - time.monotonic()))

    async def _warm_up(self) -> None:
        """Run ``warmup_turns`` READ turns, 64 in flight on 4 connections."""
        started = time.monotonic()
        numbers = iter(range(self.config.warmup_turns))

        async def lane(client: ControlClient) -> None:
            for n in numbers:
                params = {
                    "session_id": self.session_id,
                    "kind": "instruction",
                    "command_type": "READ",
                    "target_selector": f"#warm-{n}",
                    "timeout_ms": 5000,
                    "declared_outputs": [],
                    "idempotency_key": f"soak-warmup-{self.config.seed}-{n}",
                    "wait_s": 60,
                }
                await client.call("turn.submit", **params)

        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(ControlClient(self.stack.control_socket))
                for _ in range(4)
            ]
            async with anyio.create_task_group() as tg:
                for index in range(64):
                    tg.start_soon(lane, clients[index % 4])
        self.show(
            f"warm-up: {self.config.warmup_turns} turns in {time.monotonic() - started:.1f} s"
        )

    async def _sampler(self, end: float, pid: int) -> None:
        seen = 0
        tick = self.started
        while tick + 1.0 <= end:
            tick += 1.0
            await anyio.sleep(max(0.0, tick - time.monotonic()))
            sample = sample_process(pid)
            finished = [lat for at, lat in self.latencies[seen:] if at <= tick]
            seen += len(finished)
            self.report.samples.append(
                SoakSample(
                    t=tick - self.started,
                    rss_mb=sample.rss_mb,
                    fds=sample.fds,
                    threads=sample.threads,
                    latency_ms=statistics.median(finished) if finished else None,
                )
            )

    async def run(self) -> None:
        await self.stack.start_daemon()
        for index in range(2):
            await self.stack.start_executor(
                f"ok-{index}",
                ["supervisor.examples.chaos_executor", "--commands", "READ", "--slots", "4"],
            )
        await self.stack.start_executor(
            "flaky",
            [
                "supervisor.examples.chaos_executor",
                "--commands",
                "READ",
                "--behaviour",
                "error",
                "--probability",
                "0.05",
                "--seed",
                str(self.config.seed),
            ],
        )
        async with ControlClient(self.stack.control_socket) as client:
            opened = await client.call("session.open", package_id="demo")
        self.session_id = str(opened["session_id"])
        await self._warm_up()
        daemon = self.stack.daemon
        assert daemon is not None
        self.started = time.monotonic()
        end = self.started + self.config.seconds
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sampler, end, daemon.pid)
            for _ in range(self.config.clients):
                tg.start_soon(self._client, end)
        async with ControlClient(self.stack.control_socket) as client:
            verify = await client.call("ledger.verify", session_id=self.session_id)
        for failure in verify["failures"]:
            self.report.problems.append(f"ledger.verify: {failure}")

    def latency_figures(self) -> None:
        """The run's latency percentiles, into the report."""
        ordered = sorted(latency for _at, latency in self.latencies)
        if ordered:
            self.report.latency_p50_ms = ordered[len(ordered) // 2]
            self.report.latency_p99_ms = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def judge_trends(report: SoakReport, config: SoakConfig) -> None:
    """The slopes of *report*'s samples over the second half against ``config.bounds``; each
    one beyond its bound is added to ``report.problems``."""
    bounds = config.bounds
    half = [s for s in report.samples if s.t > config.seconds / 2]
    if len(half) < 2:
        report.problems.append(f"only {len(half)} samples in the second half")
        return
    minutes = [s.t / 60 for s in half]
    lat = [(s.t / 60, s.latency_ms) for s in half if s.latency_ms is not None]
    median_lat = statistics.median(v for _t, v in lat) if lat else 0.0
    span = minutes[-1] - minutes[0]
    series: list[tuple[str, float, float, float]] = [
        (
            "rss_mb",
            slope(minutes, [s.rss_mb for s in half]),
            bounds.rss_mb_per_min,
            bounds.rss_mb_floor,
        ),
        (
            "fds",
            slope(minutes, [float(s.fds) for s in half]),
            bounds.fds_per_min,
            bounds.fds_floor,
        ),
        (
            "threads",
            slope(minutes, [float(s.threads) for s in half]),
            bounds.threads_per_min,
            bounds.threads_floor,
        ),
        (
            "latency_ms",
            slope([t for t, _v in lat], [v for _t, v in lat]) if len(lat) > 1 else 0.0,
            max(1.0, bounds.latency_share_per_min * median_lat),
            max(bounds.latency_floor_ms, median_lat),
        ),
    ]
    for name, value, bound, floor in series:
        report.slopes[name] = value
        if value > bound and value * span > floor:
            report.problems.append(
                f"{name} grows {value:+.2f} per minute over the second half "
                f"(bound {bound:.2f} per minute), {value * span:+.1f} across it"
            )


async def run_soak(
    root: Path, config: SoakConfig, *, show: Callable[[str], None] = lambda line: None
) -> SoakReport:
    """Run the whole soak on a fresh *root* (see the module docstring)."""
    started = time.monotonic()
    config_path = prepare_root(root, fresh=True, config_text=SOAK_CONFIG)
    stack = DemoStack(root=root, config_path=config_path)
    soak = _Soak(stack, config, show)
    report = soak.report
    try:
        show(f"soak: root {root}, {config.seconds:.0f} s at {config.rate:.0f} turns/s")
        await soak.run()
        soak.latency_figures()
        judge_trends(report, config)
        for executor_id in list(stack.executors):
            await stack.stop_executor(executor_id)
        code = await stack.stop_daemon(signal.SIGTERM)
        if code != 0:
            report.problems.append(f"the final SIGTERM stop exited {code}, not 0")
    finally:
        await stack.aclose()
        report.problems.extend(check_daemon_log(stack.daemon_log, tolerated=[ANYIO_READ_RACE]))
        report.anyio_read_races = count_log_events(stack.daemon_log, ANYIO_READ_RACE)
        report.elapsed_s = time.monotonic() - started
    return report


def format_samples(report: SoakReport, *, every: int = 10) -> Sequence[str]:
    """Every *every*-th sample as a line (for the script's output)."""
    return [
        f"  t={s.t:5.0f} s  RSS {s.rss_mb:6.1f} MB  fds {s.fds:4d}  threads {s.threads:3d}  "
        f"latency {'-' if s.latency_ms is None else f'{s.latency_ms:.0f} ms'}"
        for s in report.samples[every - 1 :: every]
    ]
