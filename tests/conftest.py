"""Suite-wide hooks.

Some tests skip when the machine lacks what they attack with (root, Landlock, the native launcher,
systemd-nspawn, setpriv). On a developer's laptop that is a fair answer; in CI it would let a
missing capability stand in for a security check. With ``PYTEST_FAIL_ON_SKIP=1`` (set by
``.ci/run``) every skip is reported as a failure that names the reason.

The reliability suites (crash, executor chaos, soak) each record one headline line with the
`headline` fixture; the lines are printed in the terminal summary ("reliability suite
figures"), whatever ``-s`` says, and appended to ``$SUITE_HEADLINES_FILE`` when it is set
(``.ci/run`` prints that file at its end).

The quick tier (``pytest --quick``, what ``./scripts/test --quick`` runs): the unit tests of every
package, for the loop of someone changing one part. It leaves out the tests marked ``slow`` or
``systemd``, the suites in `NOT_QUICK` (storms, fuzzing, the browser, attack and helper
suites, benchmark smoke runs, other programs' builds, commands run as processes end to end)
and what needs PostgreSQL (it runs on the embedded engine); they are deselected or not collected,
never skipped, so ``PYTEST_FAIL_ON_SKIP=1`` means what it meant. Without ``--quick`` everything
runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Final

import pytest

FAIL_ON_SKIP = os.environ.get("PYTEST_FAIL_ON_SKIP") == "1"

#: What the quick tier leaves out, by path under ``tests/`` (a folder or a file), and why.
NOT_QUICK: Final[dict[str, str]] = {
    "fuzz": "fuzzing: thousands of generated inputs",
    "storms": "the fleet nemesis: three daemons under faults",
    "console/test_console_browser.py": "a headless browser",
    "scripts/test_compare_smoke.py": "runs the peer comparison benchmark",
    "sandbox/helper": "the root sandbox helper as a process, end to end",
    "sandbox/runtime/test_escapes.py": "the escape attacks: fork bombs, floods, orphans",
    "supervisor/test_systemd_units.py": "boots a real systemd",
    "supervisor/test_operations_walkthrough.py": "the operations guide under a real systemd",
    "supervisor/test_ts_executor.py": "builds and runs the TypeScript executor",
    "supervisor/store/test_postgres_contention.py": "three daemons contending on PostgreSQL",
    "supervisor/cli/test_config_discovery.py": "every client command as a process, end to end",
    "console/test_console_cli.py": "`hunter console` and `hunter serve` as processes",
    "console/test_console_http.py": "the console's attack suite over HTTP (forgeries, hosts, ids)",
    "mcp/test_stdio.py": "`hunter mcp` as a process over stdio, end to end",
    "mcp/test_hostile.py": "`hunter mcp` as a process under hostile input",
}
#: Fixtures of the PostgreSQL engine: the quick tier runs on the embedded one (SQLite).
NOT_QUICK_FIXTURES: Final = frozenset({"pg_cluster", "pg_dsn", "own_pg_cluster"})
#: Markers whose tests the quick tier leaves out.
NOT_QUICK_MARKERS: Final = ("slow", "systemd")
_TESTS: Final = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the quick tier: leave out slow, systemd, storm, fuzz, browser and other long"
        " suites (tests/conftest.py NOT_QUICK)",
    )


def _not_quick(path: Path) -> bool:
    try:
        relative = path.resolve().relative_to(_TESTS).as_posix()
    except ValueError:
        return False
    return any(relative == p or relative.startswith(f"{p}/") for p in NOT_QUICK)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("quick") and _not_quick(collection_path):
        return True
    return None


def _on_postgres(item: pytest.Item) -> bool:
    """The test needs a PostgreSQL cluster: a fixture of one, or a "postgres" engine param."""
    if NOT_QUICK_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgres" in callspec.params.values()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("quick"):
        return
    keep: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        marked = any(item.get_closest_marker(name) for name in NOT_QUICK_MARKERS)
        (left_out if marked or _on_postgres(item) else keep).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = keep


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
