"""A long executor chaos run: a hundred-plus executors misbehaving at random under real turns.

The scenario is `tests.storms.chaos` (the CI test ``tests/supervisor/test_chaos_suite.py``
runs a bounded one): swarms of chaos executors (hang, slow, garbage and oversized frames, wrong
and missing ids, authority claims, errors, refusals, flapping connections), real executor
processes that die and come back, slowloris clients on both sockets, while clients submit
turns and a poller calls ``status`` with a deadline. Every attempt must be decided as the
tables of docs/protocol.md and docs/policy.md say, status must answer throughout, the daemon
must stay up, and its fds and RSS must come back near the baseline once the crowd has left.

Usage: ``.venv/bin/python scripts/chaos_storm.py [--seconds 300] [--executors 120]
[--seed 1] [--root DIR] [--keep]``. Exit 0 only when nothing is violated.
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

from tests.storms.chaos import ChaosConfig, ChaosReport, format_violations, run_chaos  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(
        prog="chaos_storm.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="storm (300)")
    parser.add_argument("--executors", type=int, default=defaults.executors, help="(120)")
    parser.add_argument("--swarms", type=int, default=defaults.swarms, help="processes (4)")
    parser.add_argument("--submitters", type=int, default=defaults.submitters)
    parser.add_argument("--probability", type=float, default=defaults.probability)
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
        config = ChaosConfig(
            seconds=args.seconds,
            executors=args.executors,
            swarms=args.swarms,
            submitters=args.submitters,
            probability=args.probability,
            seed=args.seed,
        )
    except ValueError as exc:
        sys.stderr.write(f"chaos_storm: {exc}\n")
        return 2
    base: Path | None = None
    if args.root is None:
        base = Path(tempfile.mkdtemp(prefix="hunter-chaos-"))
        os.chmod(base, 0o711)  # process turns run as another uid: keep it traversable
        root = base / "root"
    else:
        root = args.root.absolute()

    async def chaos() -> ChaosReport:
        return await run_chaos(root, config, show=show)

    report = anyio.run(chaos)
    for line in format_violations(report):
        show(f"  VIOLATION {line}")
    show(report.summary())
    if base is not None:
        if args.keep or not report.ok:
            show(f"root kept: {root} (daemon.log, executor-*.log, planes/)")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
