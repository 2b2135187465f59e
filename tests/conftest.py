"""Suite-wide hooks.

Some tests skip when the machine lacks what they attack with (root, Landlock, the native launcher,
systemd-nspawn, setpriv). On a developer's laptop that is a fair answer; in CI it would let a
missing capability stand in for a security check. With ``PYTEST_FAIL_ON_SKIP=1`` (set by
``.ci/run``) every skip is reported as a failure that names the reason.

The reliability suites (crash, executor chaos, soak) each record one headline line with the
`headline` fixture; the lines are printed in the terminal summary ("reliability suite
figures"), whatever ``-s`` says, and appended to ``$SUITE_HEADLINES_FILE`` when it is set
(``.ci/run`` prints that file at its end).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from pathlib import Path

import pytest

FAIL_ON_SKIP = os.environ.get("PYTEST_FAIL_ON_SKIP") == "1"

#: ``(suite, line)`` recorded by the reliability suites (see `headline`).
HEADLINES: list[tuple[str, str]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if FAIL_ON_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (PYTEST_FAIL_ON_SKIP=1): {reason}"
    return report


def _record_headline(suite: str, line: str) -> None:
    HEADLINES.append((suite, line))
    path = os.environ.get("SUITE_HEADLINES_FILE")
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(f"{suite}: {line}\n")


@pytest.fixture
def headline() -> Callable[[str, str], None]:
    """Record a suite's headline figures: ``headline("crash", "6 SIGKILLs, ...")``."""
    return _record_headline


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not HEADLINES:
        return
    terminalreporter.section("reliability suite figures")
    for suite, line in HEADLINES:
        terminalreporter.write_line(f"{suite}: {line}")


@pytest.fixture(autouse=True, scope="session")
def _loggers_never_cached() -> Generator[None, None, None]:
    """`supervisor.logging.configure_logging` has structlog cache each module's logger on first
    use (a production saving). In one test process that would freeze a module's logger into the
    configuration of the first test that used it (an in-process daemon's JSON output), and a
    later test's `structlog.testing.capture_logs` would see nothing from it: the tests' outcome
    would depend on their order. Here nothing is cached."""
    import structlog

    configure = structlog.configure

    def uncached(**settings: object) -> None:
        settings["cache_logger_on_first_use"] = False
        configure(**settings)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structlog, "configure", uncached)
        yield
