"""benchmarks/compare.py runs end to end in its quick mode and writes every expected row.

No timing is asserted: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "compare.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SANDBOX_ROWS = (
    "| bare posix_spawn |",
    "| bwrap (comparable policy) |",
    "| hunter launcher (confined spawn only) |",
    "| hunter turn (full, daemon's path) |",
)
LEDGER_ROWS = (
    "| one file, 20,000 entries |",
    "| 8 sessions, ",
    "| same, parallel (",
)


@pytest.fixture(scope="module")
def report() -> ModuleType:
    """benchmarks/peers/report.py (benchmarks/ is not an installed package)."""
    path = REPO / "benchmarks" / "peers" / "report.py"
    spec = importlib.util.spec_from_file_location("compare_report", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cell_gives_median_and_range(report: ModuleType) -> None:
    """A figure over rounds reads 'median (min-max)'; one round reads as its value."""
    assert report.cell([3.0, 1.0, 2.0]) == "2 (1-3)"
    assert report.cell([1.5], "{:.1f}") == "1.5"


def test_ratio_cell_pairs_rounds(report: ModuleType) -> None:
    """Ratios are taken round by round, then summarised."""
    assert report.ratio_cell([10.0, 30.0, 20.0], [5.0, 10.0, 20.0]) == "2.00 (1.00-3.00)x"


def test_table_is_markdown(report: ModuleType) -> None:
    """A table has a header, a rule and one line per row."""
    assert report.table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxed turns need root")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap missing (scripts/setup-system)")
def test_quick_sandbox_and_ledger_report(tmp_path: Path) -> None:
    """--quick --only sandbox,ledger writes report.md with every row and both plots."""
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--only", "sandbox,ledger", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert "Sections that failed" not in report
    assert "## Machine" in report
    assert "## 2. Sandboxed process turns" in report
    assert "## 3. Ledger verification" in report
    for row in SANDBOX_ROWS + LEDGER_ROWS:
        assert row in report, row
    for name in ("sandbox.png", "ledger.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
        assert f"]({name})" in report
