"""Seed 000/001 section 8: no browser library anywhere in the policy core, even transitively."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox

BROWSER_LIBS = ("playwright", "selenium", "pyppeteer", "splinter", "mechanize", "webbot")
POLICY_FILES = sorted(
    path
    for path in Path(sandbox.__file__).parent.glob("*.py")
    if path.stem
    in {
        "__init__",
        "attempt_policy",
        "error_classifier",
        "executor_safety",
        "executor_types",
        "policy_errors",
        "reason_codes",
        "retry_protocol",
        "sandbox_context",
        "sandbox_engine",
        "sandbox_types",
    }
)


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda path: path.stem)
def test_policy_module_imports_no_browser(path: Path) -> None:
    """No policy module imports playwright, selenium, pyppeteer or another browser driver."""
    assert _imported_roots(path).isdisjoint(BROWSER_LIBS)


def test_importing_sandbox_loads_no_browser_module() -> None:
    """A fresh interpreter that imports `sandbox` has no browser module loaded."""
    code = (
        "import sys, sandbox, sandbox.retry_protocol, sandbox.executor_safety;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BROWSER_LIBS!r}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == "[]"


def test_all_policy_files_were_found() -> None:
    """The glob found every policy module (guards against a silently empty parametrisation)."""
    assert len(POLICY_FILES) == 11
