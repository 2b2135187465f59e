"""Checks docs/requirements-coverage.md against the code, the tests and the seed documents.

Fails (exit 1) when:
- a requirement ID that a seed document defines has no row;
- a row marked covered names a code file that does not exist, or a test
  (`tests/path.py::test_name`) whose file or test function does not exist;
- a row is not covered and does not name the open issue that will cover it (`not yet (#N)`);
- with --strict, any row is not covered.

Usage: python scripts/check_requirements.py [--seeds DIR] [--strict]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "requirements-coverage.md"

# IDs the seeds define (seed 004's FR-RT IDs, seed 003's bracketed IDs). Checked against the seed
# files themselves when --seeds is given, so a new seed requirement cannot slip through.
KNOWN_SEED_IDS = (
    *(f"FR-RT-{n:03d}" for n in range(1, 19)),
    "3_MCP-TAS-090",
    "UNKNOWN-802",
)
SEED_ID_PATTERNS = (
    re.compile(r"\bFR-RT-\d{3}\b"),
    re.compile(r"\[([0-9A-Z_]+-[A-Z]+-\d+|UNKNOWN-\d+)\]"),
)
CODE_RE = re.compile(r"`([^`]+)`")
TEST_RE = re.compile(r"^(tests/[\w/.-]+\.py)::(\w+)$")


@dataclass(frozen=True, slots=True)
class Row:
    line: int
    req_id: str
    status: str
    code: tuple[str, ...]
    tests: tuple[str, ...]


def parse_rows(text: str) -> list[Row]:
    rows: list[Row] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        cells = [c.strip() for c in raw.strip().strip("|").split("|")]
        if not raw.lstrip().startswith("|") or len(cells) < 6:
            continue
        req_id = cells[0].strip("`* ")
        if req_id in {"ID", ""} or set(req_id) <= {"-", ":"}:
            continue
        rows.append(
            Row(
                line=number,
                req_id=req_id,
                status=cells[3].lower(),
                code=tuple(CODE_RE.findall(cells[4])),
                tests=tuple(CODE_RE.findall(cells[5])),
            )
        )
    return rows


def seed_ids(seeds: Path) -> set[str]:
    found: set[str] = set()
    for path in sorted(seeds.glob("*")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for pattern in SEED_ID_PATTERNS:
            for match in pattern.finditer(text):
                found.add(match.group(1) if pattern.groups else match.group(0))
    return found


def test_exists(ref: str) -> str | None:
    match = TEST_RE.match(ref)
    if match is None:
        return f"test reference {ref!r} is not of the form tests/<file>.py::<test_name>"
    path = REPO / match.group(1)
    if not path.is_file():
        return f"test file {match.group(1)} does not exist"
    source = path.read_text(encoding="utf-8")
    if not re.search(rf"^\s*(async\s+)?def {re.escape(match.group(2))}\(", source, re.M):
        return f"{match.group(1)} has no test named {match.group(2)}"
    return None


def check(rows: list[Row], required: set[str], *, strict: bool) -> list[str]:
    problems: list[str] = []
    by_id = {row.req_id: row for row in rows}
    problems.extend(
        f"{DOC.name}: requirement {req} has no row" for req in sorted(required - by_id.keys())
    )
    for row in rows:
        where = f"{DOC.name}:{row.line}: {row.req_id}"
        if row.status.startswith("covered"):
            if not row.code:
                problems.append(f"{where}: marked covered but names no code")
            if not row.tests:
                problems.append(f"{where}: marked covered but names no test")
            problems.extend(
                f"{where}: code path {path} does not exist"
                for path in row.code
                if not (REPO / path.split("::")[0]).exists()
            )
            for ref in row.tests:
                problem = test_exists(ref)
                if problem:
                    problems.append(f"{where}: {problem}")
        elif strict:
            problems.append(f"{where}: not covered ({row.status})")
        elif not re.search(r"#\d+", row.status):
            problems.append(f"{where}: not covered and names no issue (write `not yet (#N)`)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=Path, help="directory of seed documents to cross-check")
    parser.add_argument("--strict", action="store_true", help="fail on any uncovered row")
    args = parser.parse_args(argv)
    if not DOC.is_file():
        sys.stderr.write(f"missing {DOC.relative_to(REPO)}\n")
        return 1
    rows = parse_rows(DOC.read_text(encoding="utf-8"))
    required = set(KNOWN_SEED_IDS)
    if args.seeds is not None:
        if not args.seeds.is_dir():
            sys.stderr.write(f"--seeds {args.seeds}: not a directory\n")
            return 2
        required |= seed_ids(args.seeds)
    problems = check(rows, required, strict=args.strict)
    covered = sum(row.status.startswith("covered") for row in rows)
    for problem in problems:
        sys.stderr.write(problem + "\n")
    sys.stdout.write(
        f"requirements: {len(rows)} rows, {covered} covered, {len(rows) - covered} not yet, "
        f"{len(problems)} problems\n"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
