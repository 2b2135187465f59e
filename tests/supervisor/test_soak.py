"""A 60-second soak in CI: a real daemon under a steady mixed workload, judged on trends.

The run is `tests.storms.soak` (``scripts/soak.py`` runs 10 minutes): after a warm-up that
fills the daemon's bounded caches, clients submit instruction and process turns at 20 per
second while the daemon's RSS, fds, threads and the turns' latency are sampled every second;
the least-squares slope of each over the second half must stay within `Bounds` (per minute:
RSS 4 MB, fds 6, threads 3, latency half its median; growth under a small floor is noise),
every turn must finish, the ledgers must verify and the daemon must stop cleanly.

The trend judge is tested on made-up samples below (no daemon).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from tests.storms.probe import sample_process, slope
from tests.storms.soak import SoakConfig, SoakReport, SoakSample, judge_trends, run_soak

CI_SOAK = SoakConfig(seconds=60.0)


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse (process turns run as another uid), removed after."""
    path = Path(tempfile.mkdtemp(prefix="hh-soak-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
async def test_soak_60s_shows_no_growth_trend(
    root: Path, headline: Callable[[str, str], None]
) -> None:
    """60 s at 20 turns/s: no growth trend in RSS, fds, threads or latency; all turns done."""
    with anyio.fail_after(180):
        report = await run_soak(root, CI_SOAK)
    headline("soak", report.summary())
    assert len(report.samples) >= 55, report.summary()
    assert report.turns >= 600, report.summary()  # about 1,200 at the set rate
    assert report.ok, "\n  ".join([report.summary(), *report.problems[:40]])


# -- the judge, on made-up samples ----------------------------------------------------------------


def _samples(rss: Callable[[float], float], fds: Callable[[float], int]) -> list[SoakSample]:
    return [
        SoakSample(t=float(t), rss_mb=rss(t), fds=fds(t), threads=7, latency_ms=40.0)
        for t in range(1, 61)
    ]


def test_judge_accepts_a_flat_run_with_noise() -> None:
    report = SoakReport(seed=0, samples=_samples(lambda t: 60 + (t % 3), lambda t: 30 + int(t) % 2))
    judge_trends(report, CI_SOAK)
    assert report.problems == []
    assert abs(report.slopes["rss_mb"]) < 1.0


def test_judge_takes_one_more_thread_for_noise() -> None:
    """One worker thread more half-way through the second half is a slope, not a trend."""
    samples = [
        SoakSample(t=float(t), rss_mb=60.0, fds=30, threads=6 + (t > 45), latency_ms=40.0)
        for t in range(1, 61)
    ]
    report = SoakReport(seed=0, samples=samples)
    judge_trends(report, CI_SOAK)
    assert report.slopes["threads"] > CI_SOAK.bounds.threads_per_min / 2
    assert report.problems == []


def test_judge_names_latency_that_doubles_but_not_a_blip() -> None:
    """Latency rising 40 -> 160 ms across the second half is a trend; a 10 ms rise is not."""

    def run(rise_ms: float) -> SoakReport:
        samples = [
            SoakSample(
                t=float(t), rss_mb=60.0, fds=30, threads=7,
                latency_ms=40.0 + max(0.0, t - 30) * rise_ms / 30,
            )
            for t in range(1, 61)
        ]  # fmt: skip
        report = SoakReport(seed=0, samples=samples)
        judge_trends(report, CI_SOAK)
        return report

    assert run(10.0).problems == []
    assert [p.split(" grows")[0] for p in run(120.0).problems] == ["latency_ms"]


def test_judge_names_a_leak_in_the_second_half() -> None:
    """A run flat in its first half, then leaking 10 fds and 8 MB a minute, fails."""
    report = SoakReport(
        seed=0,
        samples=_samples(
            lambda t: 60 + max(0.0, t - 30) * 8 / 60, lambda t: 30 + int(max(0, t - 30) / 6)
        ),
    )
    judge_trends(report, CI_SOAK)
    assert [p.split(" grows")[0] for p in report.problems] == ["rss_mb", "fds"]
    assert report.slopes["rss_mb"] == pytest.approx(8.0, rel=0.01)


def test_slope_and_probe() -> None:
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([1, 1], [0, 5]) == 0.0
    with pytest.raises(ValueError, match=r"^slope needs as many xs as ys, got 2 and 1$"):
        slope([0, 1], [0])
    me = sample_process(os.getpid())
    assert me.rss_bytes > 0
    assert me.fds > 2
    assert me.threads >= 1
    with pytest.raises(ProcessLookupError):
        sample_process(2**22 + 1)
