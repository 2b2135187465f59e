"""Exit codes of the daemon core's `hunter` commands (the table is in `supervisor.cli.commands`)."""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXIT_FAILED",
    "EXIT_NOT_SETTLED",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_USAGE",
    "STATE_EXIT_CODES",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
#: `hunter turn wait --timeout S`: S passed and the turn is still on its way (not final, not
#: escalated); it goes on, and waiting again is safe.
EXIT_NOT_SETTLED: Final = 8
EXIT_NO_DAEMON: Final = 10

#: Exit code of `--wait` / `turn wait` by the turn's final (or parked) state.
STATE_EXIT_CODES: Final[dict[str, int]] = {
    "succeeded": 0,
    "failed": 1,
    "timeout": 3,
    "violation": 4,
    "exhausted": 5,
    "escalated": 6,
    "terminated": 7,
    "cancelled": 7,
    "rejected": 4,
}
