"""The size of the product's pieces (issue 31): no class over 400 lines and no module over 600
in `supervisor`, `sandbox` and `ledger`, measured on the AST, with no list of exceptions. Run
with ``-s`` to see the largest pieces."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("supervisor", "sandbox", "ledger")
CLASS_MARK: Final = 400
MODULE_MARK: Final = 600


def sizes() -> dict[str, int]:
    """Every module's lines, and every class's (``path::Class``), of the product."""
    found: dict[str, int] = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text()
            name = str(path.relative_to(REPO))
            found[name] = len(text.splitlines())
            for node in ast.walk(ast.parse(text, filename=name)):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    found[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def over(found: dict[str, int]) -> dict[str, int]:
    return {
        name: lines
        for name, lines in found.items()
        if lines > (CLASS_MARK if "::" in name else MODULE_MARK)
    }


def test_no_class_over_400_lines_and_no_module_over_600() -> None:
    found = sizes()
    largest = sorted(found.items(), key=lambda kv: -kv[1])
    for name, lines in [kv for kv in largest if "::" in kv[0]][:5] + [
        kv for kv in largest if "::" not in kv[0]
    ][:5]:
        print(f"{lines:5d}  {name}")
    assert over(found) == {}, "split these along their seams (issue 31)"


def test_the_measure_counts_a_class_and_its_module() -> None:
    """The measure itself: modules and classes of the product are found and counted."""
    found = sizes()
    assert found["ledger/__init__.py"] > 0
    assert found["supervisor/store/postgres/engine.py::PostgresTurnStore"] > 100
