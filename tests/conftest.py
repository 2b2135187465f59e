"""Suite-wide hooks.

Some tests skip when the machine lacks what they attack with (root, Landlock, the native launcher,
systemd-nspawn, setpriv). On a developer's laptop that is a fair answer; in CI it would let a
missing capability stand in for a security check. With ``PYTEST_FAIL_ON_SKIP=1`` (set by
``.ci/run``) every skip is reported as a failure that names the reason.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

FAIL_ON_SKIP = os.environ.get("PYTEST_FAIL_ON_SKIP") == "1"


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
