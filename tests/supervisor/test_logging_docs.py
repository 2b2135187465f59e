"""docs/logging.md lists every log event the product emits (names found in the source)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_PACKAGES = ("supervisor", "sandbox", "ledger")
_DOC = _REPO / "docs" / "logging.md"
_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "msg"}
)
_EVENT_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")


@dataclass(frozen=True, slots=True)
class Emission:
    """One `log.<level>("event", field=...)` call found in the source."""

    event: str
    level: str
    fields: tuple[str, ...]
    where: str


def _is_logger(node: ast.expr) -> bool:
    # `log`, `_log`, `self._log`, `logger`, `self.log.bind(...)`, `get_logger(...)`, ...
    return "log" in ast.unparse(node).lower()


def _event_names(arg: ast.expr, scope: ast.AST) -> list[str]:
    """The literal event name(s) of a log call's first argument.

    A literal string, or a local variable assigned string literals in the enclosing function
    (`event = "attempt_dropped"` ... `log.warning(event, ...)`).
    """
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.Name):
        return [
            node.value.value
            for node in ast.walk(scope)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets)
        ]
    return []


def _calls(tree: ast.AST) -> Iterator[tuple[ast.Call, ast.AST]]:
    """Every call with its innermost enclosing function (or the module)."""
    stack: list[tuple[ast.AST, ast.AST]] = [(tree, tree)]
    while stack:
        node, scope = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = node
        if isinstance(node, ast.Call):
            yield node, scope
        stack.extend((child, scope) for child in ast.iter_child_nodes(node))


def iter_emissions() -> Iterator[Emission]:
    """Every structured log call with a snake_case event name in the packages."""
    for package in _PACKAGES:
        for path in sorted((_REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node, scope in _calls(tree):
                if not (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr in _METHODS
                    and _is_logger(node.func.value)
                    and node.args
                ):
                    continue
                fields = tuple(kw.arg for kw in node.keywords if kw.arg is not None)
                where = f"{path.relative_to(_REPO)}:{node.lineno}"
                for event in _event_names(node.args[0], scope):
                    if _EVENT_NAME.match(event):
                        yield Emission(event, node.func.attr, fields, where)


def _documented() -> set[str]:
    text = _DOC.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, re.M))


def test_every_emitted_event_is_documented() -> None:
    """Each event name logged in supervisor/, sandbox/ or ledger/ has a row in docs/logging.md."""
    documented = _documented()
    missing = sorted(
        {f"{e.event} ({e.where})" for e in iter_emissions() if e.event not in documented}
    )
    assert not missing, "events missing from docs/logging.md:\n" + "\n".join(missing)


def test_the_scan_finds_events() -> None:
    """The scanner itself works: the daemon's lifecycle events are found in the source."""
    found = {e.event for e in iter_emissions()}
    assert "daemon_ready" in found
