"""Agent packages: ``<root>/installed/<pkg-id>/manifest.json`` (FR-RT-001/002).

Manifest schema (unknown keys are errors, so typos do not silently widen or drop a rule)::

    {
      "id": "hello",                       # optional; must equal the directory name
      "version": "1.0", "description": "...",   # optional strings
      "capabilities": {
        "read":      ["/srv/data/**"],     # glob patterns (see sandbox/capabilities.py)
        "write":     ["reports/**"],       # relative = relative to the session workspace
        "execute":   ["python3 scripts/trace.py --explain", "/usr/bin/*"],
        "forbidden": ["/srv/data/secret/**"],
        "network":   false,                # optional, default false
        "unix_sockets": false              # optional: connect to pathname Unix sockets
      },
      "limits": {"memory_mb": 256, "pids": 64, "timeout_s": 60, "output_bytes": 1048576,
                 "file_size_mb": 16, "disk_mb": 64},           # all optional
      "env_allow": ["LANG"]                # optional: parent variables passed through
    }
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sandbox.capabilities import parse_execute_entry
from sandbox.errors import ManifestError, PackageNotFoundError

__all__ = [
    "Capabilities",
    "Limits",
    "Manifest",
    "Package",
    "load_manifest",
    "load_package",
    "parse_manifest",
]

_PACKAGE_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOP_KEYS: Final = frozenset(
    {"id", "name", "version", "description", "capabilities", "limits", "env_allow"}
)
_CAP_KEYS: Final = ("read", "write", "execute", "forbidden")
_LIMIT_KEYS: Final = ("memory_mb", "pids", "timeout_s", "output_bytes", "file_size_mb", "disk_mb")
#: Variables a manifest may never pass through (they would undo the sandbox's environment).
_ENV_DENY: Final = frozenset(
    {
        "TMPDIR",
        "TEMP",
        "TMP",
        "HOME",
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
    }
)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The four pattern lists plus the network grant, as written in the manifest."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    execute: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    network: bool = False
    #: connecting to pathname Unix sockets (off: a seccomp filter denies it; confine/seccomp.py)
    unix_sockets: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a turn; ``None`` means "the runtime's default"."""

    memory_mb: int | None = None
    pids: int | None = None
    timeout_s: float | None = None
    output_bytes: int | None = None
    file_size_mb: int | None = None
    disk_mb: int | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed, validated manifest."""

    path: str
    package_id: str | None
    capabilities: Capabilities
    limits: Limits = field(default_factory=Limits)
    env_allow: tuple[str, ...] = ()
    version: str = ""
    description: str = ""

    def to_dict(self) -> dict[str, object]:
        """The effective manifest as plain data (``hunter package check`` prints it)."""
        caps = self.capabilities
        return {
            "id": self.package_id,
            "version": self.version,
            "capabilities": {
                "read": list(caps.read),
                "write": list(caps.write),
                "execute": list(caps.execute),
                "forbidden": list(caps.forbidden),
                "network": caps.network,
                "unix_sockets": caps.unix_sockets,
            },
            "limits": {k: getattr(self.limits, k) for k in _LIMIT_KEYS},
            "env_allow": list(self.env_allow),
        }


@dataclass(frozen=True, slots=True)
class Package:
    """An installed package: its id, directory and manifest."""

    package_id: str
    directory: Path
    manifest: Manifest

    @property
    def capabilities(self) -> Capabilities:
        """Shortcut for ``manifest.capabilities``."""
        return self.manifest.capabilities


def _err(path: str, json_path: str, problem: str) -> ManifestError:
    return ManifestError(path=path, json_path=json_path, problem=problem)


def _str_list(path: str, where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _err(path, where, f"expected a list of strings, got {type(value).__name__}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _err(path, f"{where}[{i}]", "expected a non-empty string")
        if "\0" in item:
            raise _err(path, f"{where}[{i}]", "contains a NUL byte")
        out.append(item)
    return tuple(out)


def parse_manifest(data: object, *, path: str) -> Manifest:
    """Validate decoded JSON *data*; errors name *path*, the JSON path and the problem."""
    if not isinstance(data, dict):
        raise _err(path, "$", f"expected an object, got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise _err(path, f"$.{key}", "unknown key")
    pkg_id = data.get("id")
    if pkg_id is not None and (not isinstance(pkg_id, str) or not _PACKAGE_ID_RE.match(pkg_id)):
        raise _err(path, "$.id", "expected a package id ([A-Za-z0-9][A-Za-z0-9._-]*)")
    for key in ("version", "description", "name"):
        if key in data and not isinstance(data[key], str):
            raise _err(path, f"$.{key}", "expected a string")
    if "capabilities" not in data:
        raise _err(path, "$.capabilities", "missing (required)")
    caps_raw = data["capabilities"]
    if not isinstance(caps_raw, dict):
        raise _err(path, "$.capabilities", "expected an object")
    for key in caps_raw:
        if key not in (*_CAP_KEYS, "network", "unix_sockets"):
            raise _err(path, f"$.capabilities.{key}", "unknown key")
    lists = {k: _str_list(path, f"$.capabilities.{k}", caps_raw.get(k, [])) for k in _CAP_KEYS}
    for i, entry in enumerate(lists["execute"]):
        try:  # a command with argument patterns (see sandbox/capabilities.py)
            parse_execute_entry(entry)
        except ValueError as exc:
            raise _err(path, f"$.capabilities.execute[{i}]", f"{entry!r}: {exc}") from None
    network = caps_raw.get("network", False)
    if not isinstance(network, bool):
        raise _err(path, "$.capabilities.network", "expected true or false")
    unix_sockets = caps_raw.get("unix_sockets", False)
    if not isinstance(unix_sockets, bool):
        raise _err(path, "$.capabilities.unix_sockets", "expected true or false")
    limits_raw = data.get("limits", {})
    if not isinstance(limits_raw, dict):
        raise _err(path, "$.limits", "expected an object")
    limit_values: dict[str, int | float | None] = {}
    for key, value in limits_raw.items():
        if key not in _LIMIT_KEYS:
            raise _err(path, f"$.limits.{key}", "unknown key")
        ok_type = (int, float) if key == "timeout_s" else (int,)
        if isinstance(value, bool) or not isinstance(value, ok_type):
            raise _err(path, f"$.limits.{key}", "expected a positive number")
        if not math.isfinite(value) or value <= 0:
            raise _err(path, f"$.limits.{key}", "expected a positive number")
        limit_values[key] = value
    env_allow = _str_list(path, "$.env_allow", data.get("env_allow", []))
    for i, name in enumerate(env_allow):
        if not _ENV_NAME_RE.match(name):
            raise _err(path, f"$.env_allow[{i}]", "not a valid environment variable name")
        if name in _ENV_DENY or name.startswith(("LD_", "HUNTER_")):
            raise _err(path, f"$.env_allow[{i}]", f"{name} is set by the sandbox")
    return Manifest(
        path=path,
        package_id=pkg_id,
        capabilities=Capabilities(network=network, unix_sockets=unix_sockets, **lists),
        limits=Limits(**limit_values),  # type: ignore[arg-type]  # keys validated above
        env_allow=env_allow,
        version=str(data.get("version", "")),
        description=str(data.get("description", "")),
    )


def load_manifest(path: Path) -> Manifest:
    """Read and validate one manifest file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _err(str(path), "$", "file does not exist") from None
    except UnicodeDecodeError as exc:
        raise _err(str(path), "$", f"not UTF-8: {exc.reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _err(
            str(path), "$", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise _err(
            str(path), "$", "JSON nested too deeply (a manifest is a flat object of lists)"
        ) from None
    return parse_manifest(data, path=str(path))


def load_package(root: Path, package_id: str) -> Package:
    """Load ``<root>/installed/<package_id>/manifest.json`` (PackageNotFoundError if absent)."""
    manifest_path = root / "installed" / package_id / "manifest.json"
    if not _PACKAGE_ID_RE.match(package_id):
        raise PackageNotFoundError(package_id=package_id, path=str(manifest_path))
    if not manifest_path.is_file():
        raise PackageNotFoundError(package_id=package_id, path=str(manifest_path))
    manifest = load_manifest(manifest_path)
    if manifest.package_id is not None and manifest.package_id != package_id:
        raise _err(
            str(manifest_path),
            "$.id",
            f"{manifest.package_id!r} does not match the directory {package_id!r}",
        )
    return Package(package_id=package_id, directory=manifest_path.parent, manifest=manifest)
