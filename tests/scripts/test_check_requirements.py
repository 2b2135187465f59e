"""The requirements-traceability checker fails on every kind of broken row."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_requirements.py"


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_requirements", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_requirements"] = module
    spec.loader.exec_module(module)
    return module


SELF = "tests/scripts/test_check_requirements.py"
HEADER = "| ID | Source | Requirement | Status | Code | Tests |\n|---|---|---|---|---|---|\n"


def test_covered_row_with_real_code_and_test_passes(checker: ModuleType) -> None:
    """A covered row naming an existing file and test function raises no problem."""
    rows = checker.parse_rows(
        HEADER + "| X-1 | s | r | covered | `scripts/check_requirements.py` | "
        f"`{SELF}::test_covered_row_with_real_code_and_test_passes` |\n"
    )
    assert checker.check(rows, {"X-1"}, strict=True) == []


def test_missing_code_file_is_reported(checker: ModuleType) -> None:
    """A covered row naming a file that does not exist is a problem."""
    rows = checker.parse_rows(
        HEADER + "| X-1 | s | r | covered | `nowhere/missing.py` | "
        "`tests/scripts/test_check_requirements.py::test_missing_code_file_is_reported` |\n"
    )
    problems = checker.check(rows, {"X-1"}, strict=False)
    assert any("nowhere/missing.py does not exist" in p for p in problems)


def test_missing_test_function_is_reported(checker: ModuleType) -> None:
    """A covered row naming a test that is not defined is a problem."""
    rows = checker.parse_rows(
        HEADER + "| X-1 | s | r | covered | `scripts/check_requirements.py` | "
        "`tests/scripts/test_check_requirements.py::test_that_does_not_exist` |\n"
    )
    problems = checker.check(rows, {"X-1"}, strict=False)
    assert any("has no test named test_that_does_not_exist" in p for p in problems)


def test_requirement_without_row_is_reported(checker: ModuleType) -> None:
    """A seed requirement with no row in the document is a problem."""
    problems = checker.check([], {"FR-RT-001"}, strict=False)
    assert problems == ["requirements-coverage.md: requirement FR-RT-001 has no row"]


def test_uncovered_row_must_name_an_issue(checker: ModuleType) -> None:
    """`not yet` without an issue number fails; with one it passes unless --strict."""
    bare = checker.parse_rows(HEADER + "| X-1 | s | r | not yet | | |\n")
    named = checker.parse_rows(HEADER + "| X-1 | s | r | not yet (#7) | | |\n")
    assert checker.check(bare, {"X-1"}, strict=False)
    assert checker.check(named, {"X-1"}, strict=False) == []
    assert checker.check(named, {"X-1"}, strict=True)


def test_seed_ids_are_extracted_from_seed_text(checker: ModuleType, tmp_path: Path) -> None:
    """FR-RT IDs and bracketed task IDs in seed documents are found."""
    (tmp_path / "a.txt").write_text("### FR-RT-042: x\n- [3_MCP-TAS-091], [UNKNOWN-9]\n")
    assert checker.seed_ids(tmp_path) == {"FR-RT-042", "3_MCP-TAS-091", "UNKNOWN-9"}


def test_repository_document_passes() -> None:
    """The repository's own coverage document passes the checker."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
