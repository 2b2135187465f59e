"""Which of a turn's kernel denials are capability violations (pure: no I/O).

Every read, write, execution or connection the kernel blocked is one (seed 004 FR-RT-003,
FR-RT-010/011), except a read of a process's mount table: coreutils' libselinux and libmount
read ``/proc/self/mounts`` at start, ``/proc/self`` cannot be granted ahead of time (it names a
different directory in every process), and the table tells a turn nothing it may not know.
Landlock still blocks that read; only the record is left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["is_violation"]

_MOUNT_TABLE: Final = re.compile(r"/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/mount(?:s|info)")


def is_violation(blockers: Sequence[str], target: str) -> bool:
    """Whether a denial of *blockers* (Landlock's names, ``fs.read_file`` ...) on *target*
    is a capability violation of the turn."""
    if blockers and all(b == "fs.read_file" for b in blockers):
        return _MOUNT_TABLE.fullmatch(target) is None
    return True
