"""Fuzz tests: hypothesis throws generated input at every parser of untrusted bytes.

Each test runs a fixed number of examples (``max_examples``; the whole folder stays under a
minute) and asserts that only the target's documented error types come out: any other
exception, a hang or a daemon that stops answering is a failure. Every test records how many
inputs it ran with `record`; the table is printed at the end of the run and the count is
asserted, so a target that silently ran nothing fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import pytest

#: Inputs run per target, filled in by the tests (printed in the terminal summary).
COUNTS: Final[dict[str, int]] = {}


def _record(target: str, count: int, *, minimum: int) -> None:
    """Record that ``target`` ran ``count`` inputs; fail when fewer than ``minimum`` ran."""
    COUNTS[target] = COUNTS.get(target, 0) + count
    print(f"fuzz {target}: {count} inputs")
    assert count >= minimum, f"{target} ran only {count} inputs (expected >= {minimum})"


@pytest.fixture
def record() -> Callable[..., None]:
    """`_record`: call it once per target with the number of inputs the test ran."""
    return _record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    terminalreporter.section("fuzz inputs per target")
    for target, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{target:<40} {count:>7}")
    terminalreporter.write_line(f"{'total':<40} {sum(COUNTS.values()):>7}")
