"""``hunter turn run`` and ``hunter package check``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.cli import EXIT_CODES, exit_code_for
from supervisor.cli import main

Installer = Callable[..., Path]


def test_exit_codes_per_status() -> None:
    """Every status has a documented exit code; a malformed declaration is a usage error."""
    assert EXIT_CODES == {
        "succeeded": 0,
        "failed": 1,
        "timeout": 3,
        "violation": 4,
        "rejected": 4,
        "exhausted": 5,
        "escalated": 6,
        "terminated": 7,
    }
    assert exit_code_for("rejected", "DECLARATION_INVALID") == 2


def test_package_check_prints_effective_capabilities(
    install: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid package prints its capabilities with relative patterns anchored."""
    directory = install(
        "demo",
        capabilities={"read": [], "write": ["out/**"], "execute": ["sh"], "forbidden": []},
    )
    assert main(["package", "check", str(directory), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["effective"]["write"] == ["/WORKSPACE/out/**"]
    assert data["effective"]["execute"][0].startswith("/")
    assert main(["package", "check", str(directory)]) == 0
    assert "network: denied" in capsys.readouterr().out


def test_package_check_reports_the_json_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid manifest exits 1 naming the file and JSON path."""
    (tmp_path / "manifest.json").write_text('{"capabilities": {"read": [1]}}')
    assert main(["package", "check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json: $.capabilities.read[0]: expected a non-empty string" in err


def test_turn_run_needs_a_command(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No command after -- is a usage error."""
    assert main(["turn", "run", "--root", str(root), "--package", "x", "--"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_turn_run_unknown_package_is_usage(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing package exits 2 with PackageNotFoundError's message."""
    assert main(["turn", "run", "--root", str(root), "--package", "nope", "--", "true"]) == 2
    assert "package 'nope' not found" in capsys.readouterr().err


def test_turn_run_on_a_new_root_refuses_before_creating_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`turn run --package demo` on a root with no package installed exits 2, says how to
    install one (the command, with this root) and leaves nothing behind: no root, no output/,
    state/ or tmp/; an existing empty root stays empty."""
    new_root = tmp_path / "new"
    argv = ["turn", "run", "--root", str(new_root), "--package", "demo", "--", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "package 'demo' not found" in err
    assert f"install it first: hunter package install DIR --root {new_root}" in err
    assert f"installed packages: hunter package list --root {new_root}" in err
    assert not new_root.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["turn", "run", "--root", str(empty), "--package", "demo", "--", "true"]) == 2
    assert list(empty.iterdir()) == []


@pytest.mark.usefixtures("sandboxed")
def test_turn_run_succeeds_and_promotes(
    root: Path, install: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real sandboxed turn from the command line; JSON result; exit 0."""
    install("demo")
    argv = ["turn", "run", "--root", str(root), "--package", "demo", "--json"]
    argv += ["--declare-output", "r.txt:report", "--", "sh", "-c", "echo hi > r.txt"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "succeeded"
    assert Path(data["promoted_outputs"][0]["destination"]).read_text() == "hi\n"


@pytest.mark.slow  # the `hunter` binary four times: seconds (not the quick tier)
@pytest.mark.usefixtures("sandboxed")
def test_turn_run_exit_codes_for_outcomes(root: Path, install: Installer) -> None:
    """The real `hunter` binary: violation 4, failed 1, timeout 3, rejected 4."""
    install("demo")
    hunter = Path(sys.executable).with_name("hunter")
    base = [str(hunter), "turn", "run", "--root", str(root), "--package", "demo"]
    cases = [
        (["--", "sh", "-c", "echo x > undeclared"], 4),
        (["--phase", "RED", "--", "sh", "-c", "exit 1"], 1),
        (["--phase", "RED", "--timeout", "0.3", "--", "sleep", "5"], 3),
        (["--", "/sbin/nologin-not-allowed"], 4),
    ]
    for extra, code in cases:
        proc = subprocess.run([*base, *extra], capture_output=True, text=True, check=False)
        assert proc.returncode == code, (extra, proc.stdout, proc.stderr)
