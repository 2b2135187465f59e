"""Seed 000/001 section 8: no browser library anywhere in the policy core, even transitively."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox

BROWSER_LIBS = ("playwright", "selenium", "pyppeteer", "splinter", "mechanize", "webbot")
SANDBOX_DIR = Path(sandbox.__file__).parent
#: The whole policy folder, the package's __init__ and the seed-name modules that re-export it.
POLICY_FILES = sorted(
    [
        SANDBOX_DIR / "__init__.py",
        *SANDBOX_DIR.glob("sandbox_*.py"),
        *(SANDBOX_DIR / "policy").rglob("*.py"),
    ]
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
        "import sys, sandbox, sandbox.policy.retry_protocol, sandbox.policy.safety;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BROWSER_LIBS!r}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == "[]"


def test_all_policy_files_were_found() -> None:
    """The glob found every policy module (guards against a silently empty parametrisation)."""
    names = {p.stem for p in POLICY_FILES}
    assert {"sandbox_types", "sandbox_engine", "faults", "safety", "attempts"} <= names
    assert len(POLICY_FILES) >= 15
