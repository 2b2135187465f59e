"""Packages and manifests: loading, validation errors naming file + JSON path (FR-RT-001/002)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox.errors import ManifestError, PackageNotFoundError
from sandbox.packages import Limits, load_manifest, load_package, parse_manifest


def write(root: Path, package_id: str, data: object) -> Path:
    """Write ``installed/<id>/manifest.json``."""
    directory = root / "installed" / package_id
    directory.mkdir(parents=True)
    path = directory / "manifest.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_load_package_reads_capabilities(tmp_path: Path) -> None:
    """Every capability list, the network grant, limits and env_allow are parsed."""
    write(
        tmp_path,
        "pkg",
        {
            "id": "pkg",
            "version": "1.2",
            "capabilities": {
                "read": ["/srv/**"],
                "write": ["out/**"],
                "execute": ["python3"],
                "forbidden": ["/srv/secret/**"],
                "network": True,
            },
            "limits": {"memory_mb": 64, "timeout_s": 1.5},
            "env_allow": ["LANG"],
        },
    )
    package = load_package(tmp_path, "pkg")
    caps = package.capabilities
    assert caps.read == ("/srv/**",)
    assert caps.write == ("out/**",)
    assert caps.execute == ("python3",)
    assert caps.forbidden == ("/srv/secret/**",)
    assert caps.network is True
    assert package.manifest.limits == Limits(memory_mb=64, timeout_s=1.5)
    assert package.manifest.env_allow == ("LANG",)
    assert package.manifest.to_dict()["version"] == "1.2"


def test_missing_package_raises_package_not_found(tmp_path: Path) -> None:
    """An absent package directory is PackageNotFoundError naming the manifest path."""
    with pytest.raises(PackageNotFoundError, match=r"^package 'nope' not found: .*manifest\.json"):
        load_package(tmp_path, "nope")
    with pytest.raises(PackageNotFoundError, match=r"^package '\.\./x' not found"):
        load_package(tmp_path, "../x")


def test_invalid_json_names_file_and_position(tmp_path: Path) -> None:
    """Broken JSON is a ManifestError with the file, ``$`` and the parser's position."""
    path = write(tmp_path, "bad", '{"capabilities": [}')
    with pytest.raises(
        ManifestError, match=r"^.*manifest\.json: \$: invalid JSON at line 1"
    ) as info:
        load_manifest(path)
    assert info.value.path == str(path)
    assert info.value.json_path == "$"


@pytest.mark.parametrize(
    ("data", "json_path", "problem"),
    [
        ([], "$", "expected an object"),
        ({}, "$.capabilities", "missing (required)"),
        ({"capabilities": {"read": "x"}}, "$.capabilities.read", "expected a list of strings"),
        ({"capabilities": {"write": ["ok", 3]}}, "$.capabilities.write[1]", "expected a non-empty"),
        ({"capabilities": {"exec": []}}, "$.capabilities.exec", "unknown key"),
        ({"capabilities": {"network": "yes"}}, "$.capabilities.network", "expected true or false"),
        ({"capabilities": {}, "limits": {"pids": 0}}, "$.limits.pids", "expected a positive"),
        ({"capabilities": {}, "limits": {"pids": True}}, "$.limits.pids", "expected a positive"),
        ({"capabilities": {}, "limits": {"cpu": 1}}, "$.limits.cpu", "unknown key"),
        ({"capabilities": {}, "env_allow": ["LD_PRELOAD"]}, "$.env_allow[0]", "LD_PRELOAD is set"),
        ({"capabilities": {}, "env_allow": ["A-B"]}, "$.env_allow[0]", "not a valid"),
        ({"capabilities": {}, "extra": 1}, "$.extra", "unknown key"),
        ({"id": "a b", "capabilities": {}}, "$.id", "expected a package id"),
    ],
)
def test_schema_errors_name_the_json_path(data: object, json_path: str, problem: str) -> None:
    """Each schema error carries the JSON path of the offending value and what is wrong."""
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, path="m.json")
    assert info.value.path == "m.json"
    assert info.value.json_path == json_path
    assert info.value.problem.startswith(problem)
    assert str(info.value).startswith(f"m.json: {json_path}: {problem}")


def test_id_must_match_directory(tmp_path: Path) -> None:
    """A manifest id that differs from its directory name is an error."""
    write(tmp_path, "dir", {"id": "other", "capabilities": {}})
    with pytest.raises(ManifestError, match=r"^.*: \$\.id: 'other' does not match the directory"):
        load_package(tmp_path, "dir")


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_manifest_is_a_manifest_error(tmp_path: Path, depth: int) -> None:
    """A hostile, deeply nested manifest is a clear ManifestError, never a RecursionError."""
    path = write(tmp_path, "deep", '{"capabilities": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ManifestError, match=r"nested too deeply|must be"):
        load_manifest(path)


@pytest.mark.slow  # a deep tree checked by the CLI: seconds (not the quick tier)
def test_package_check_cli_reports_deep_nesting(tmp_path: Path) -> None:
    """`hunter package check` prints the manifest error, not a traceback."""
    import subprocess
    import sys

    directory = write(tmp_path, "deep", "[" * 100_000 + "]" * 100_000).parent
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "package", "check", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "nested too deeply" in proc.stderr + proc.stdout
