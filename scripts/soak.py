"""A soak: a real daemon under a steady mixed workload for 10 minutes, failing on growth trends.

The run is `tests.storms.soak` (the CI test ``tests/supervisor/test_soak.py`` runs 60 s):
clients submit instruction turns and sandboxed process turns at a steady rate while the
daemon's RSS, fds and threads and the turns' median latency are sampled every second; over
the second half of the run the least-squares slope of each must stay within its bound (per
minute: RSS 4 MB, fds 6, threads 3, latency half the median; a slope whose growth across the
half stays under a small floor is noise), every turn must finish, the ledgers must verify and
the daemon must stop cleanly.

Usage: ``.venv/bin/python scripts/soak.py [--seconds 600] [--rate 20] [--seed 1] [--root DIR]
[--keep]``. Prints a line every 10 samples and a summary; exit 0 only when nothing is wrong.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``tests.storms`` below, run as a script

from tests.storms.soak import SoakConfig, SoakReport, format_samples, run_soak  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(
        prog="soak.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="(600)")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="turns/s (20)")
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--seed", type=int, default=defaults.seed, help="RNG seed (1)")
    parser.add_argument("--root", type=Path, default=None, help="root to use (emptied first)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary root")
    return parser


def show(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = SoakConfig(
            seconds=args.seconds, rate=args.rate, clients=args.clients, seed=args.seed
        )
    except ValueError as exc:
        sys.stderr.write(f"soak: {exc}\n")
        return 2
    base: Path | None = None
    if args.root is None:
        base = Path(tempfile.mkdtemp(prefix="hunter-soak-"))
        os.chmod(base, 0o711)  # process turns run as another uid: keep it traversable
        root = base / "root"
    else:
        root = args.root.absolute()

    async def soak() -> SoakReport:
        return await run_soak(root, config, show=show)

    report = anyio.run(soak)
    for line in format_samples(report):
        show(line)
    for line in report.problems[:50]:
        show(f"  PROBLEM {line}")
    show(report.summary())
    if base is not None:
        if args.keep or not report.ok:
            show(f"root kept: {root} (daemon.log, executor-*.log, planes/)")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
