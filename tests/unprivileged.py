"""Run a command of this checkout as an unprivileged uid, with no capabilities at all.

`setpriv` drops the uid, gid, groups and every capability (bounding set included). The
Python environment may live under a directory other users cannot traverse (a pyenv under
``/root``, mode 0700): the command then runs in a private mount namespace where each such
directory is replaced by an empty tmpfs holding only the path down to the environment,
bind-mounted (systemd's ``ProtectHome=tmpfs`` plus ``BindReadOnlyPaths=`` does the same for a
unit). Nothing outside that namespace changes.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["as_unprivileged"]


def _blocked(path: Path) -> list[tuple[Path, Path]]:
    """``(blocked directory, its child on the way to path)`` for each ancestor of *path* that
    other users cannot traverse."""
    out = []
    parts = path.parts
    for i in range(1, len(parts) - 1):
        directory = Path(*parts[: i + 1])
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            out.append((directory, Path(*parts[: i + 2])))
    return out


def as_unprivileged(uid: int, gid: int, argv: Sequence[str]) -> list[str]:
    """The command line that runs *argv* as *uid*:*gid* with no capabilities."""
    drop = [
        "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip
    needed = {Path(os.path.realpath(p)) for p in (sys.base_prefix, sys.prefix)}
    children: dict[Path, set[Path]] = {}
    for target in needed:
        for directory, child in _blocked(target):
            children.setdefault(directory, set()).add(child)
    steps: list[str] = []
    for directory in sorted(children):
        kept = sorted(children[directory])
        for n, child in enumerate(kept):
            steps += [f"t{n}=$(mktemp -d)", f'mount --bind {shlex.quote(str(child))} "$t{n}"']
        steps.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(directory))}")
        for n, child in enumerate(kept):
            quoted = shlex.quote(str(child))
            steps += [f"mkdir -p {quoted}", f'mount --move "$t{n}" {quoted}', f'rmdir "$t{n}"']
    if not steps:
        return [*drop, *argv]
    script = "set -e\n" + "\n".join(steps) + '\nexec "$@"\n'
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
            "sh", *drop, *argv]  # fmt: skip
