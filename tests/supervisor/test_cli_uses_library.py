"""The `hunter` commands reach the daemon through the client library (`supervisor.client`) only:
no module of `supervisor/cli/` imports the raw connection (`supervisor.control.client`), calls a
raw operation (``.call(...)``, ``.subscribe(...)``) or spells an operation's name, so every CLI
test exercises the library."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.wire.control import OPERATIONS

CLI = Path(__file__).resolve().parents[2] / "supervisor" / "cli"
#: Operation names a request dict would carry; the plain ones ("status", "drain", "ping") are
#: also command names, so only the dotted ones are looked for.
DOTTED_OPERATIONS = frozenset(op for op in OPERATIONS if "." in op)


def _modules() -> list[Path]:
    return sorted(CLI.glob("*.py"))


def _findings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "supervisor.control"
        ):
            yield f"{where}: imports {node.module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("supervisor.control"):
                    yield f"{where}: imports {alias.name}"
        elif isinstance(node, ast.Name | ast.alias) and "ControlClient" in {
            getattr(node, "id", None),
            getattr(node, "name", None),
        }:
            yield f"{where}: names ControlClient"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"call", "subscribe"}:
                yield f"{where}: calls .{node.func.attr}(...)"
        elif isinstance(node, ast.Constant) and node.value in DOTTED_OPERATIONS:
            yield f"{where}: spells the operation {node.value!r}"


def test_there_are_cli_modules_to_check() -> None:
    names = {p.name for p in _modules()}
    assert {"client.py", "turn_commands.py", "event_commands.py"} <= names
    assert "turn.submit" in DOTTED_OPERATIONS


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_the_cli_module_uses_the_client_library(path: Path) -> None:
    found = list(_findings(path))
    assert not found, "use supervisor.client (the library) instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scan itself: each way of going around the library is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from supervisor.control.client import ControlClient\n"
        "import supervisor.control.client\n"
        "async def f(client):\n"
        "    await client.call('turn.get', turn_id=1)\n"
        "    async with client.subscribe(turns=[1]):\n"
        "        pass\n"
        "    return {'op': 'session.open'}\n",
        encoding="utf-8",
    )
    found = "\n".join(_findings(bad))
    for expected in (
        "imports supervisor.control.client",
        "names ControlClient",
        "calls .call(...)",
        "calls .subscribe(...)",
        "spells the operation 'turn.get'",
        "spells the operation 'session.open'",
    ):
        assert expected in found
