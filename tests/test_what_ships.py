"""What ships: the product packages (`supervisor`, `sandbox`, `ledger`) never import the test
tools, benchmarks or scripts that live beside them, and `supervisor/demo` holds the demo a user
runs, not the storm harnesses (they live in `tests/storms/`, with the scripts that run them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("supervisor", "sandbox", "ledger")
NOT_SHIPPED = ("tests", "benchmarks", "scripts")


def _imported(path: Path) -> set[str]:
    """Every module *path* imports (absolute imports: the product uses no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_never_imports_what_does_not_ship(package: str) -> None:
    found = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        for name in sorted(_imported(path))
        if name.split(".")[0] in NOT_SHIPPED
    ]
    assert found == []


def test_the_demo_package_holds_the_demo_only() -> None:
    """The crash, chaos and soak storms and their checks are test tools: not in the product."""
    storms = {"crash", "crash_checks", "chaos", "chaos_swarm", "soak", "probe"}
    shipped = {p.stem for p in (REPO / "supervisor" / "demo").glob("*.py")}
    assert shipped & storms == set()
    assert storms <= {p.stem for p in (REPO / "tests" / "storms").glob("*.py")}
