"""The minimal durable loop (``../shared/tools/limit``), run beside a benchmark of the daemon.

That folder is a measuring instrument kept beside the repository, not part of it: a supervisor
loop that does a turn's durable work (accept record, executor round trip, two chained ledger
entries, final record) with nothing else. `run_limit` copies it to a scratch directory, runs its
own harness there for the variants asked (``bench.py --only ... --reps 1``), and returns what
each did: turns/s at 64 and 256 in flight, p50 at 1 in flight, its CPU per turn. Nothing of it is
imported: it runs as its own processes, with the interpreter given (it needs ``orjson``,
``uvloop`` and ``anyio``: the ``dev`` extra has them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LimitFigures", "run_limit"]

#: the variants a benchmark of the daemon compares with: the same durable work on SQLite (B),
#: and on a plain journal file with asyncio Protocols (A)
VARIANTS = ("B-sqlite-uvloop", "A-uvloop")


@dataclass(frozen=True)
class LimitFigures:
    """One variant of the minimal loop, one run."""

    variant: str
    throughput: float
    throughput_256: float
    p50_us: float
    cpu_us_per_turn: float
    verified: bool


def run_limit(
    tool: Path, *, variants: tuple[str, ...] = VARIANTS, seconds: float = 5.0
) -> list[LimitFigures]:
    """Run *variants* of the loop in *tool* once each (about 20 s a variant)."""
    if not (tool / "bench.py").is_file():
        raise SystemExit(f"--limit {tool}: no bench.py there (the folder of the minimal loop)")
    scratch = Path(tempfile.mkdtemp(prefix="hh-limit-"))
    try:
        copy = scratch / "limit"
        shutil.copytree(tool, copy, ignore=shutil.ignore_patterns("results", "tmp", ".venv"))
        out = copy / "results" / "limit.json"
        out.parent.mkdir()
        run = subprocess.run(
            [
                sys.executable,
                "bench.py",
                "--reps",
                "1",
                "--duration",
                str(seconds),
                "--only",
                ",".join(variants),
                "--out",
                str(out),
            ],
            cwd=copy,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if run.returncode != 0:
            raise SystemExit(
                f"the minimal loop failed (exit {run.returncode}):\n{run.stderr[-2000:]}"
            )
        data = json.loads(out.read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = []
    for record in data["runs"]:
        t64 = record["t64"]
        figures.append(
            LimitFigures(
                variant=record["variant"],
                throughput=float(t64["tput"]),
                throughput_256=float(record.get("t256", {}).get("tput", 0.0)),
                p50_us=float(record["lat"]["p50_us"]),
                cpu_us_per_turn=float(t64["sup_cpu_s"]) / max(1, int(t64["sup_turns"])) * 1e6,
                verified=bool(record.get("verify", {}).get("ok", False)),
            )
        )
    return figures
