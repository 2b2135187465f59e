"""The sandbox package's inner layers: the runtime and the root helper do not import each other
in a cycle (the helper serves the runtime; the runtime reaches the helper through a Protocol),
and the results both carry sit below both. Checked on the AST, type-checking imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sandbox

SANDBOX_DIR = Path(sandbox.__file__).parent


def _imported(path: Path) -> set[str]:
    """Every module *path* imports, at the top, in a function or under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
    return found


def _under(package: str, module: str) -> bool:
    return module == package or module.startswith(f"{package}.")


@pytest.mark.parametrize(
    "path",
    sorted((SANDBOX_DIR / "runtime").glob("*.py")),
    ids=lambda p: p.name,
)
def test_the_runtime_never_imports_the_helper(path: Path) -> None:
    """No module of sandbox/runtime imports sandbox.helper, not even for type checking."""
    assert [m for m in _imported(path) if _under("sandbox.helper", m)] == []


def test_the_results_sit_below_the_runtime_and_the_helper() -> None:
    """sandbox/runs.py, which both the runtime and the helper use, imports neither."""
    imported = _imported(SANDBOX_DIR / "runs.py")
    assert [
        m for m in imported if _under("sandbox.runtime", m) or _under("sandbox.helper", m)
    ] == []


def test_the_helpers_client_side_takes_results_from_below() -> None:
    """The helper's wire and client import the run results from sandbox.runs, not the runtime."""
    for name in ("wire.py", "remote.py"):
        imported = _imported(SANDBOX_DIR / "helper" / name)
        assert not any(_under("sandbox.runtime", m) for m in imported), name
