"""Figures over rounds (median and min-max), ratios pair by pair, Markdown tables and plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

DAEMON_COLOUR = "#1f5fa8"
PEER_COLOURS = ["#d9822b", "#9b9b9b", "#6a9a4f", "#b04a5a"]


def median(values: Sequence[float]) -> float:
    """The median of *values*."""
    return statistics.median(values)


def cell(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """``median (min-max)`` of the rounds, or the one value of a single round."""
    if len(values) == 1:
        return fmt.format(values[0])
    low, high = min(values), max(values)
    return f"{fmt.format(median(values))} ({fmt.format(low)}-{fmt.format(high)})"


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Round by round: ``numerators[i] / denominators[i]``."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def ratio_cell(numerators: Sequence[float], denominators: Sequence[float]) -> str:
    """The pairwise ratios as ``median (min-max)`` with an ``x``."""
    return cell(ratios(numerators, denominators), "{:.2f}") + "x"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _errors(series: Sequence[Sequence[float]]) -> tuple[list[float], list[list[float]]]:
    mids = [median(v) for v in series]
    return mids, [
        [m - min(v) for m, v in zip(mids, series, strict=True)],
        [max(v) - m for m, v in zip(mids, series, strict=True)],
    ]


def _bars(
    ax: Axes,
    *,
    groups: Sequence[str],
    series: dict[str, Sequence[Sequence[float]]],
    ylabel: str,
    log: bool,
) -> None:
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        mids, err = _errors(values)
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        colour = DAEMON_COLOUR if index == 0 else PEER_COLOURS[(index - 1) % len(PEER_COLOURS)]
        ax.bar(xs, mids, width, yerr=err, capsize=3, label=name, color=colour)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)


def grouped_bars(
    path: Path,
    *,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[Sequence[float]]],
    ylabel: str,
    log: bool = False,
) -> None:
    """One bar per series in each group: the median, with the min-max as an error bar.
    ``series[name][g]`` holds the rounds' values of group *g*; the first series is the daemon."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    _bars(ax, groups=groups, series=series, ylabel=ylabel, log=log)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grouped_bar_panels(
    path: Path,
    *,
    title: str,
    groups: Sequence[str],
    panels: dict[str, dict[str, Sequence[Sequence[float]]]],
    ylabel: str,
    log: bool = False,
) -> None:
    """``grouped_bars`` side by side, one panel per entry of *panels* (its title -> series)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.2), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        _bars(ax, groups=groups, series=series, ylabel=ylabel, log=log)
        ax.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale_plot(
    path: Path,
    *,
    panels: Sequence[tuple[str, Sequence[int], Sequence[Sequence[float]], Sequence[float]]],
) -> None:
    """One panel per scale axis: daemon CPU per turn (median, min-max) and RSS against the
    step. ``panels``: (x label, steps, CPU ms per turn per step, RSS MB per step)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    for ax, (label, steps, cpu, rss) in zip(axes[0], panels, strict=True):
        mids, err = _errors(cpu)
        ax.errorbar(steps, mids, yerr=err, marker="o", color=DAEMON_COLOUR, capsize=3)
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel(label)
        ax.set_ylabel("daemon CPU per READ turn (ms)", color=DAEMON_COLOUR)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot(steps, rss, marker="s", linestyle="--", color=PEER_COLOURS[0])
        twin.set_ylabel("daemon RSS (MB)", color=PEER_COLOURS[0])
        twin.set_ylim(bottom=0)
    fig.suptitle("Daemon cost per turn and memory as work queues and executors connect")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
