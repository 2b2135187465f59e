"""Installing agent packages under ``<root>/installed/<package_id>/`` (``hunter package install``)
and listing them (``hunter package list``).

An install validates the manifest first (the errors are `sandbox.packages`' own), then copies
the package directory into a temporary directory beside the target (``installed/.install-*``),
syncs every file and directory to disk, and renames it into place: a session opening the
package sees the old package or the new one, never a half-copied one. A package already
installed with the same content is left as it is; one with different content is refused unless
*replace* is given (then the old directory is renamed aside first and removed after; a session
opened in that instant may find no package and fail cleanly). A crash leaves only hidden
``.install-*``/``.old-*`` directories, which `list_packages` ignores and the next install of that
package removes.

Only regular files and directories are copied: a symlink or special file in the package is
refused (it could make the installed package depend on, or point at, something outside it).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sandbox.errors import ManifestError, SandboxError
from sandbox.packages import Manifest, load_manifest, load_package

__all__ = [
    "InstallResult",
    "InstalledPackage",
    "PackageInstallError",
    "install_package",
    "list_packages",
    "tree_digest",
]

#: The same rule as ``sandbox.packages`` applies to ids and directory names.
_PACKAGE_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_STAGING_PREFIX: Final = ".install-"
_OLD_PREFIX: Final = ".old-"
_CHUNK: Final = 1 << 20


class PackageInstallError(SandboxError):
    """Raised when a package cannot be installed: ``path`` is what was at fault (the source,
    a file in it, or the installed directory), ``problem`` what was wrong, ``hint`` what to do.
    An invalid manifest raises `ManifestError` instead."""

    def __init__(self, *, path: str, problem: str, hint: str = "") -> None:
        self.path = path
        self.problem = problem
        self.hint = hint
        super().__init__(f"{path}: {problem}" + (f"; {hint}" if hint else ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallResult:
    """What `install_package` did: ``installed`` (new), ``replaced`` or ``unchanged``."""

    package_id: str
    version: str
    directory: Path
    action: Literal["installed", "replaced", "unchanged"]
    #: sha256 over the package's relative paths, modes and contents (`tree_digest`)
    digest: str
    files: int

    def to_dict(self) -> dict[str, object]:
        return {
            "package_id": self.package_id,
            "version": self.version,
            "directory": str(self.directory),
            "action": self.action,
            "digest": self.digest,
            "files": self.files,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class InstalledPackage:
    """One directory under ``installed/``: its manifest, or the error that makes it unusable."""

    package_id: str
    directory: Path
    manifest: Manifest | None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "package_id": self.package_id,
            "directory": str(self.directory),
            "valid": self.manifest is not None,
            "error": self.error,
        }
        if self.manifest is not None:
            manifest = self.manifest.to_dict()
            data.update(
                version=self.manifest.version or None,
                description=self.manifest.description or None,
                capabilities=manifest["capabilities"],
                limits=manifest["limits"],
                env_allow=manifest["env_allow"],
            )
        return data


def _source_dir(source: Path) -> tuple[Path, Path]:
    """(package directory, manifest path) for a directory or a manifest file."""
    if source.is_dir():
        return source, source / "manifest.json"
    if source.is_file():
        return source.parent, source
    raise PackageInstallError(
        path=str(source),
        problem="no such file or directory",
        hint="give the package directory or its manifest.json",
    )


def _entries(directory: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative posix path, path, lstat) of every file and directory below *directory*,
    sorted; refuses anything that is not a regular file or a directory."""
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            info = path.lstat()
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "a special file"
                raise PackageInstallError(
                    path=str(path),
                    problem=f"is {kind}; a package holds only regular files and directories",
                    hint="replace it with a copy of what it points at, or remove it",
                )
            yield path.relative_to(directory).as_posix(), path, info


def tree_digest(directory: Path) -> tuple[str, int]:
    """(sha256 hex, file count) over every entry's relative path, kind, permission bits and
    content: two directories with the same digest install the same package."""
    digest = hashlib.sha256()
    files = 0
    for rel, path, info in _entries(directory):
        is_dir = stat.S_ISDIR(info.st_mode)
        mode = stat.S_IMODE(info.st_mode) & 0o777
        digest.update(f"{'d' if is_dir else 'f'} {mode:o} {rel}\0".encode())
        if not is_dir:
            files += 1
            with path.open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
            digest.update(b"\0")
    return digest.hexdigest(), files


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_tree(source: Path, staging: Path) -> None:
    """Copy *source* into the (existing, empty) *staging*, syncing every file and directory."""
    dirs = [staging]
    for rel, path, info in _entries(source):
        target = staging / rel
        mode = stat.S_IMODE(info.st_mode) & 0o777
        if stat.S_ISDIR(info.st_mode):
            target.mkdir(mode=0o700)  # its own mode once its files are in (it may be read-only)
            dirs.append(target)
            continue
        with path.open("rb") as src, target.open("xb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
            dst.flush()
            os.fsync(dst.fileno())
        target.chmod(mode)
    # Directories get their modes last (a read-only one must not stop the copy into it).
    for rel, _path, info in _entries(source):
        if stat.S_ISDIR(info.st_mode):
            (staging / rel).chmod(stat.S_IMODE(info.st_mode) & 0o777)
    staging.chmod(0o755)
    for directory in reversed(dirs):
        _fsync_path(directory)


def _remove_leftovers(installed: Path, package_id: str) -> None:
    """Remove the hidden directories an interrupted install of *package_id* left behind."""
    for prefix in (_STAGING_PREFIX, _OLD_PREFIX):
        for leftover in installed.glob(f"{prefix}{package_id}.*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _package_id(manifest: Manifest, package_dir: Path) -> str:
    package_id = manifest.package_id or package_dir.resolve().name
    if not _PACKAGE_ID_RE.match(package_id):
        raise ManifestError(
            path=manifest.path,
            json_path="$.id",
            problem=(
                f"no id, and the directory name {package_id!r} is not a package id "
                '([A-Za-z0-9][A-Za-z0-9._-]*); add an "id" to the manifest'
            ),
        )
    return package_id


def install_package(source: Path, *, root: Path, replace: bool = False) -> InstallResult:
    """Validate the package at *source* (a directory or its ``manifest.json``) and install it
    as ``<root>/installed/<id>/`` (see the module docstring). The id is the manifest's ``id``,
    else the directory's name.

    Raises `ManifestError` for an invalid manifest and `PackageInstallError` when the package
    cannot be copied or a different package of that id is installed and *replace* is false.
    """
    package_dir, manifest_path = _source_dir(source)
    if manifest_path.name != "manifest.json":
        raise PackageInstallError(
            path=str(manifest_path),
            problem="a package's manifest must be named manifest.json",
            hint="rename it, or give the package directory",
        )
    manifest = load_manifest(manifest_path)
    package_id = _package_id(manifest, package_dir)
    installed = root / "installed"
    target = installed / package_id
    source_real = package_dir.resolve()
    if source_real == target.resolve():
        raise PackageInstallError(
            path=str(package_dir),
            problem="is already the installed copy",
            hint="install from the package's source directory",
        )
    if installed.resolve().is_relative_to(source_real):
        raise PackageInstallError(
            path=str(package_dir),
            problem=f"contains the root it would be installed into ({root})",
            hint="keep the package's source outside the root",
        )
    digest, files = tree_digest(package_dir)
    action: Literal["installed", "replaced", "unchanged"] = "installed"
    if target.exists():
        current, _ = tree_digest(target)
        if current == digest:
            return InstallResult(
                package_id=package_id,
                version=manifest.version,
                directory=target,
                action="unchanged",
                digest=digest,
                files=files,
            )
        if not replace:
            raise PackageInstallError(
                path=str(target),
                problem=f"package {package_id!r} is installed with different content",
                hint="pass --replace to replace it (sessions already open keep the old one)",
            )
        action = "replaced"
    installed.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(installed, package_id)
    staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{package_id}.", dir=installed))
    try:
        _copy_tree(package_dir, staging)
        load_manifest(staging / "manifest.json")  # the copy is what was validated
        if action == "replaced":
            aside = Path(tempfile.mkdtemp(prefix=f"{_OLD_PREFIX}{package_id}.", dir=installed))
            target.rename(aside / package_id)
            try:
                staging.rename(target)
            except OSError:
                (aside / package_id).rename(target)  # put the old one back
                raise
            _fsync_path(installed)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            try:
                staging.rename(target)
            except OSError as exc:  # another install of this id won the race
                raise PackageInstallError(
                    path=str(target),
                    problem=f"appeared while installing ({exc.strerror})",
                    hint="another install ran at the same time; run this one again",
                ) from None
            _fsync_path(installed)
    finally:
        if staging.exists():  # not renamed into place: an error on the way
            shutil.rmtree(staging, ignore_errors=True)
    return InstallResult(
        package_id=package_id,
        version=manifest.version,
        directory=target,
        action=action,
        digest=digest,
        files=files,
    )


def list_packages(root: Path) -> list[InstalledPackage]:
    """Every package directory under ``<root>/installed/``, by id; a broken one carries its
    error instead of a manifest (hidden directories of an install in progress are skipped)."""
    installed = root / "installed"
    if not installed.is_dir():
        return []
    found: list[InstalledPackage] = []
    for directory in sorted(installed.iterdir()):
        if directory.name.startswith(".") or not directory.is_dir():
            continue
        try:
            package = load_package(root, directory.name)
        except SandboxError as exc:
            found.append(
                InstalledPackage(
                    package_id=directory.name, directory=directory, manifest=None, error=str(exc)
                )
            )
            continue
        found.append(
            InstalledPackage(
                package_id=package.package_id, directory=directory, manifest=package.manifest
            )
        )
    return found
