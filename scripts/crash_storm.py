"""A long crash storm: SIGKILL a real daemon again and again under a stream of turns.

The scenario is `tests.storms.crash` (the CI test ``tests/supervisor/test_crash.py`` runs a
short one): clients submit instruction turns with idempotency keys while the daemon is
SIGKILLed ``--kills`` times at seeded random points and restarted; then every acknowledged
turn must be final, every key must name one turn, every final turn must have exactly one final
entry in its session's exec ledger and exactly one entry for its ending in its evidence ledger,
every turn a restart rolled forward (ended from its ledger entry) must show an attempt count of
at least 1 and attempts that ended (outcome, decision, reason code, finish time), the ledgers
must verify and the daemon log must hold no traceback. The summary counts the rolled-forward
turns.

With ``--mixed`` about 30% of the turns are sandboxed process turns (some running when a kill
lands, one leaving a background child behind), and after the final clean stop nothing may be
left: no process of the storm's sandbox uids, no turn cgroup of the root, no file in a
session's scratch dirs.

Usage: ``.venv/bin/python scripts/crash_storm.py [--kills 20] [--turns 3000] [--mixed]
[--seed 1] [--starve 2] [--root DIR]`` (``--starve N``: N busy-loop processes take the CPU for
the whole storm). Prints a line per kill and a summary; exit 0 only when nothing is
violated.
Without ``--root`` the root is a temporary directory, removed afterwards unless the storm
failed or ``--keep`` is given.
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

from tests.storms.crash import StormConfig, StormReport, format_violations, run_storm  # noqa: E402
from tests.storms.starvation import BusyLoops  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    defaults = StormConfig()
    parser = argparse.ArgumentParser(
        prog="crash_storm.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--kills", type=int, default=defaults.kills, help="SIGKILLs (20)")
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns (3000)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="RNG seed (1)")
    parser.add_argument(
        "--root", type=Path, default=None, help="root to use (emptied first; kept afterwards)"
    )
    parser.add_argument("--submitters", type=int, default=defaults.submitters)
    parser.add_argument("--executors", type=int, default=defaults.executors)
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="mixed load: about 30%% sandboxed process turns beside the instruction turns",
    )
    parser.add_argument(
        "--starve",
        type=int,
        default=0,
        metavar="N",
        help="N busy-loop processes take the CPU for the whole storm (a noisy neighbour)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary root")
    return parser


def show(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    try:
        config = StormConfig(
            kills=args.kills,
            turns=args.turns,
            seed=args.seed,
            submitters=args.submitters,
            executors=args.executors,
            mixed=args.mixed,
        )
    except ValueError as exc:
        sys.stderr.write(f"crash_storm: {exc}\n")
        return 2
    base: Path | None = None
    if args.root is None:
        base = Path(tempfile.mkdtemp(prefix="hunter-crash-"))
        os.chmod(base, 0o711)  # process turns would run as another uid: keep it traversable
        root = base / "root"
    else:
        root = args.root.absolute()

    async def storm() -> StormReport:
        return await run_storm(root, config, show=show)

    busy = BusyLoops(args.starve)
    busy.start()
    try:
        report = anyio.run(storm)
    finally:
        busy.stop()
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
