"""The fleet nemesis, long: three daemons on one PostgreSQL under a seeded storm of faults.

Each seed is one run of `tests.storms.run.run_nemesis` (docs/nemesis.md): a private
PostgreSQL, a TCP proxy per daemon, three ``hunter serve`` daemons with two no-op executors
each, mixed turns submitted round-robin with idempotency keys, faults drawn from the seed (CPU
starvation, SIGSTOP past the lease, SIGSTOP mid-commit, SIGKILL and restart, a server restart,
network delay and a black hole), then the checker over the history and the end state.

Usage::

    .venv/bin/python scripts/nemesis.py --seeds 1-10 --duration 120 --turns 2000 --starve 2
    .venv/bin/python scripts/nemesis.py --seed 3 --faults pause,kill --keep

Prints progress lines while it runs and, per seed, a summary (turns acknowledged and final,
duplicates, ledger mismatches, double runs, tracebacks, takeover times, the longest unanswered
call, deadlocks) and each failing check's findings; exits 1 when a check failed on any seed, 2
on a usage error or a run that could not be set up.
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``tests.storms`` below, run as a script

from tests.storms.fleet import FleetError  # noqa: E402
from tests.storms.nemesis import FAULT_KINDS  # noqa: E402
from tests.storms.run import NemesisConfig, run_nemesis  # noqa: E402
from tests.supervisor.store.pg_cluster import PgClusterError  # noqa: E402


def seeds(text: str) -> list[int]:
    """``3`` or ``1-10`` or ``1,4,7``."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def faults(text: str) -> tuple[str, ...]:
    chosen = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = sorted(set(chosen) - set(FAULT_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown faults {unknown}; known: {', '.join(FAULT_KINDS)}"
        )
    return chosen


def window(text: str) -> tuple[float, float]:
    first, _, last = text.partition("-")
    return float(first), float(last)


def build_parser() -> argparse.ArgumentParser:
    defaults = NemesisConfig()
    parser = argparse.ArgumentParser(
        prog="nemesis.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="one seed (default 1)")
    which.add_argument("--seeds", type=seeds, help="seeds: 1-10, or 1,4,7")
    parser.add_argument(
        "--duration", type=float, default=defaults.duration_s, help="seconds of load and faults"
    )
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns per run")
    parser.add_argument(
        "--starve", type=int, default=defaults.starve, help="busy-loop processes during the load"
    )
    parser.add_argument(
        "--starve-window",
        type=window,
        default=None,
        metavar="FROM-TO",
        help="starve only from FROM to TO seconds after the load began",
    )
    parser.add_argument(
        "--cpu-quota",
        type=int,
        default=None,
        metavar="PCT",
        help="limit the daemons to PCT%% of one CPU (their own cgroup; skipped if not writable)",
    )
    parser.add_argument(
        "--faults",
        type=faults,
        default=defaults.faults,
        help=f"comma-separated, of: {', '.join(FAULT_KINDS)} (default: all)",
    )
    parser.add_argument("--lease-ms", type=int, default=defaults.lease_ms)
    parser.add_argument(
        "--pause", type=float, default=defaults.pause_s, help="SIGSTOP length of 'pause' (8 s)"
    )
    parser.add_argument(
        "--settle", type=float, default=defaults.settle_s, help="wait for turns to end (60 s)"
    )
    parser.add_argument(
        "--takeover-bound",
        type=float,
        default=None,
        help="seconds a takeover may take (default: two leases and 2 s)",
    )
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    parser.add_argument(
        "--details", type=int, default=12, help="findings listed per failing check (12)"
    )
    return parser


def show(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chosen = args.seeds or [args.seed if args.seed is not None else 1]
    failed: list[int] = []
    summaries: list[str] = []
    for seed in chosen:
        config = NemesisConfig(
            seed=seed,
            duration_s=args.duration,
            turns=args.turns,
            faults=args.faults,
            starve=args.starve,
            starve_window=args.starve_window,
            cpu_quota=args.cpu_quota,
            lease_ms=args.lease_ms,
            pause_s=args.pause,
            settle_s=args.settle,
            takeover_bound_s=args.takeover_bound,
            keep=args.keep,
        )
        show(f"=== seed {seed}")
        try:
            verdict = anyio.run(functools.partial(run_nemesis, config, show=show))
        except (FleetError, PgClusterError) as exc:
            show(f"seed {seed}: could not set the run up: {exc}")
            return 2
        except Exception:  # the harness broke (everything it started is stopped): say where
            traceback.print_exc()
            show(f"seed {seed}: the run itself failed (traceback above)")
            return 2
        show(verdict.summary())
        for line in verdict.details(limit=args.details):
            show(f"  {line}")
        summaries.append(verdict.summary())
        if not verdict.ok:
            failed.append(seed)
    if len(chosen) > 1:
        show("=== summary")
        for line in summaries:
            show(line)
    show(f"{len(chosen) - len(failed)} of {len(chosen)} seeds passed every check")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
